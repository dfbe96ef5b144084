"""Model shapes of synthetic checkpoints and their config.json (transformers' config classes).

One `Shape` (the dimensions) and one builder per family (`hf_config`) serve the
named shapes of `edge0.synth.layout` (`SHAPES`, up to the 35B-A3B) and the tiny
random HF checkpoints of `edge0.synth.tiny` alike.
"""

from __future__ import annotations

from typing import Any

import attrs

from edge0.errors import ConversionError
from edge0.synth.flagships import FLAGSHIPS, flagship_config

FAMILIES = ("qwen3_moe", "qwen3_5_moe")


@attrs.frozen
class Shape:
    """The dimensions of a qwen3_moe / qwen3_5_moe model (qwen3_5_moe: every 4th layer is full
    attention, the rest Gated DeltaNet)."""

    model_type: str = "qwen3_5_moe"
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    experts: int = 8
    top_k: int = 2
    moe_ff: int = 32
    shared_ff: int = 32  # qwen3_5_moe only
    lin_k_heads: int = 2  # Gated DeltaNet (qwen3_5_moe only)
    lin_v_heads: int = 4
    lin_head_dim: int = 16


def hf_config(shape: Shape, vocab: int, **extra: Any) -> dict[str, Any]:
    """config.json of `shape` with `vocab` tokens; `extra` are more config fields (text config)."""
    if shape.model_type == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        cfg: Any = Qwen3MoeConfig(
            **{
                **dict(
                    vocab_size=vocab,
                    hidden_size=shape.hidden,
                    intermediate_size=2 * shape.hidden,
                    num_hidden_layers=shape.layers,
                    num_attention_heads=shape.heads,
                    num_key_value_heads=shape.kv_heads,
                    head_dim=shape.head_dim,
                    num_experts=shape.experts,
                    num_experts_per_tok=shape.top_k,
                    moe_intermediate_size=shape.moe_ff,
                    norm_topk_prob=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    architectures=["Qwen3MoeForCausalLM"],
                    dtype="bfloat16",
                ),
                **extra,
            }
        )
    elif shape.model_type == "qwen3_5_moe":
        from transformers import Qwen3_5MoeConfig

        text = (
            dict(
                vocab_size=vocab,
                hidden_size=shape.hidden,
                num_hidden_layers=shape.layers,
                num_attention_heads=shape.heads,
                num_key_value_heads=shape.kv_heads,
                head_dim=shape.head_dim,
                linear_num_key_heads=shape.lin_k_heads,
                linear_num_value_heads=shape.lin_v_heads,
                linear_key_head_dim=shape.lin_head_dim,
                linear_value_head_dim=shape.lin_head_dim,
                num_experts=shape.experts,
                num_experts_per_tok=shape.top_k,
                moe_intermediate_size=shape.moe_ff,
                shared_expert_intermediate_size=shape.shared_ff,
                dtype="bfloat16",
            )
            | extra
        )
        cfg = Qwen3_5MoeConfig(text_config=text, architectures=[QWEN3_5_ARCH])
    else:
        raise ConversionError(
            f"synthetic checkpoints exist for {', '.join(FAMILIES)}, not {shape.model_type!r}"
        )
    out: dict[str, Any] = cfg.to_dict()
    return out


QWEN3_5_ARCH = "Qwen3_5MoeForConditionalGeneration"
_SMALL_35 = Shape(
    hidden=512,
    layers=8,
    heads=8,
    head_dim=64,
    experts=64,
    top_k=4,
    moe_ff=256,
    shared_ff=256,
    lin_k_heads=4,
    lin_v_heads=8,
    lin_head_dim=64,
)
# name -> (shape, vocabulary size); the 35B-A3B shapes are transformers' own defaults
NAMED: dict[str, tuple[Shape, int]] = {
    "tiny": (Shape(moe_ff=64, shared_ff=64), 512),
    "small": (_SMALL_35, 4096),
    "medium": (
        attrs.evolve(
            _SMALL_35,
            hidden=1024,
            layers=12,
            head_dim=128,
            experts=128,
            top_k=8,
            moe_ff=512,
            shared_ff=512,
        ),
        32768,
    ),
    "tiny-qwen3": (Shape(model_type="qwen3_moe", moe_ff=64), 512),
    "small-qwen3": (attrs.evolve(_SMALL_35, model_type="qwen3_moe"), 4096),
}


def shape_config(name: str) -> dict[str, Any]:
    """config.json of a named shape (SHAPES)."""
    from transformers import Qwen3_5MoeConfig

    cfg: dict[str, Any]
    if name in NAMED:
        shape, vocab = NAMED[name]
        return hf_config(shape, vocab)
    if name == "qwen3.5-35b-a3b":
        cfg = Qwen3_5MoeConfig(architectures=[QWEN3_5_ARCH]).to_dict()
    elif name == "qwen3.5-35b-a3b-4layers":  # the 35B's tensors, 4 of its 40 layers
        text = Qwen3_5MoeConfig().to_dict()["text_config"]
        text.update(num_hidden_layers=4, layer_types=text["layer_types"][:4])
        cfg = Qwen3_5MoeConfig(text_config=text, architectures=[QWEN3_5_ARCH]).to_dict()
    elif name == "qwen3-30b-a3b":
        shape = Shape(
            model_type="qwen3_moe",
            hidden=2048,
            layers=48,
            heads=32,
            kv_heads=4,
            head_dim=128,
            experts=128,
            top_k=8,
            moe_ff=768,
        )
        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        cfg = hf_config(
            shape,
            151936,
            intermediate_size=6144,
            max_position_embeddings=40960,
            tie_word_embeddings=False,
            rms_norm_eps=1e-6,
            rope_parameters=rope,
        )
    elif name in FLAGSHIPS:  # the other families' flagships (edge0/synth/flagships.py)
        cfg = flagship_config(name)
    else:
        raise ConversionError(f"unknown shape {name!r}; choose one of {', '.join(SHAPES)}")
    return cfg


SHAPES = ("qwen3.5-35b-a3b", "qwen3.5-35b-a3b-4layers", "qwen3-30b-a3b", *NAMED, *FLAGSHIPS)
