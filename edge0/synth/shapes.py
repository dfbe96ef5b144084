"""Named model shapes for synthetic checkpoints, built with transformers' config classes."""

from __future__ import annotations

from typing import Any

from edge0.errors import ConversionError
from edge0.synth.flagships import FLAGSHIPS, flagship_config


def shape_config(name: str) -> dict[str, Any]:
    """config.json of a named shape, built with transformers' config classes."""
    from transformers import Qwen3_5MoeConfig, Qwen3MoeConfig

    small_35 = dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=64,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        vocab_size=4096,
    )
    tiny_35 = dict(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        vocab_size=512,
    )
    medium_35 = dict(
        small_35,
        hidden_size=1024,
        num_hidden_layers=12,
        num_attention_heads=8,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        vocab_size=32768,
    )
    cfg: Any
    if name == "qwen3.5-35b-a3b":
        cfg = Qwen3_5MoeConfig(architectures=["Qwen3_5MoeForConditionalGeneration"])
    elif name == "qwen3.5-35b-a3b-4layers":  # the 35B's tensors, 4 of its 40 layers
        text = Qwen3_5MoeConfig().to_dict()["text_config"]
        text.update(num_hidden_layers=4, layer_types=text["layer_types"][:4])
        cfg = Qwen3_5MoeConfig(
            text_config=text, architectures=["Qwen3_5MoeForConditionalGeneration"]
        )
    elif name in ("tiny", "small", "medium"):
        text = dict(
            {"tiny": tiny_35, "small": small_35, "medium": medium_35}[name], dtype="bfloat16"
        )
        cfg = Qwen3_5MoeConfig(
            text_config=text, architectures=["Qwen3_5MoeForConditionalGeneration"]
        )
    elif name == "qwen3-30b-a3b":
        cfg = Qwen3MoeConfig(
            **_kw(
                vocab_size=151936,
                hidden_size=2048,
                intermediate_size=6144,
                num_hidden_layers=48,
                num_attention_heads=32,
                num_key_value_heads=4,
                head_dim=128,
                num_experts=128,
                num_experts_per_tok=8,
                moe_intermediate_size=768,
                norm_topk_prob=True,
                max_position_embeddings=40960,
                tie_word_embeddings=False,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                architectures=["Qwen3MoeForCausalLM"],
                dtype="bfloat16",
            )
        )
    elif name in ("tiny-qwen3", "small-qwen3"):
        big = name == "small-qwen3"
        cfg = Qwen3MoeConfig(
            **_kw(
                vocab_size=4096 if big else 512,
                hidden_size=512 if big else 64,
                intermediate_size=1024 if big else 128,
                num_hidden_layers=8 if big else 4,
                num_attention_heads=8 if big else 4,
                num_key_value_heads=2,
                head_dim=64 if big else 16,
                num_experts=64 if big else 8,
                num_experts_per_tok=4 if big else 2,
                moe_intermediate_size=256 if big else 64,
                norm_topk_prob=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                architectures=["Qwen3MoeForCausalLM"],
                dtype="bfloat16",
            )
        )
    elif name in FLAGSHIPS:  # the other families' flagships (edge0/synth/flagships.py)
        return flagship_config(name)
    else:
        raise ConversionError(f"unknown shape {name!r}; choose one of {', '.join(SHAPES)}")
    out: dict[str, Any] = cfg.to_dict()
    return out


def _kw(**kwargs: Any) -> dict[str, Any]:
    return kwargs


SHAPES = (
    "qwen3.5-35b-a3b",
    "qwen3.5-35b-a3b-4layers",
    "qwen3-30b-a3b",
    "tiny",
    "small",
    "medium",
    "tiny-qwen3",
    "small-qwen3",
    *FLAGSHIPS,
)
