"""OLMoE: softmax over all experts, top-k, renormalised only with norm_topk_prob (off in 1B-7B).

Experts are `mlp.experts.E.{gate,up,down}_proj.weight`; no shared expert.
"""

from __future__ import annotations

from typing import Any, ClassVar

from edge0.families import tiny
from edge0.families.audit import (
    EXPERTS,
    HALVES,
    ROPES,
    TIED_OK,
    Fields,
    Rope,
    computed,
    derived_head_dim,
    edge0,
    only,
    where,
)
from edge0.families.base import Family
from edge0.families.probes import YARN


def _tiny(vocab: int) -> Any:
    from transformers import OlmoeConfig

    return OlmoeConfig(
        **tiny.common(vocab),
        intermediate_size=tiny.FF,
        num_key_value_heads=tiny.KV,
        num_experts=8,
        num_experts_per_tok=2,
    )


def _olmoe_1b_7b() -> Any:
    from transformers import OlmoeConfig

    return OlmoeConfig(
        vocab_size=50304,
        hidden_size=2048,
        intermediate_size=1024,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_experts=64,
        num_experts_per_tok=8,
        norm_topk_prob=False,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


class Olmoe(Family):
    name = "olmoe"
    model_types: ClassVar[dict[str, str]] = {"olmoe": "olmoe"}
    routing = "softmax, top-k (renormalised with norm_topk_prob)"

    fields: ClassVar[Fields] = {
        "num_experts": edge0(EXPERTS),
        "rope_parameters": Rope(
            ROPES, "mlx-lm's olmoe builds these rope types (longrope differs from transformers')"
        ),
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "clip_qkv": only(None, why="mlx-lm's olmoe never clips q, k and v"),
        "norm_topk_prob": computed("renormalise the top-k weights (golden-tested both ways)"),
        "tie_word_embeddings": computed(TIED_OK),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "OLMoE's q/k norms span hidden_size (transformers fails otherwise)",
        ),
        "mlp_bias": only(None, False, why="transformers' OLMoE experts have no biases"),
        "rope_traditional": only(None, False, why=HALVES),
    }

    flagships: ClassVar[dict[str, Any]] = {"olmoe-1b-7b": _olmoe_1b_7b}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "attention_bias": {"attention_bias": True},
        "clip_qkv": {"clip_qkv": 0.5},
        "head_dim": {"head_dim": 32},
        "tied": {"tie_word_embeddings": True},
        "norm_topk": {"norm_topk_prob": True},
        "gelu": {"hidden_act": "gelu"},
    }
    variant: ClassVar[dict[str, Any]] = {
        "attention_bias": True,
        "tie_word_embeddings": True,
        "norm_topk_prob": True,
        "rope_parameters": dict(YARN),
    }
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"clip_qkv": 0.5}, "clip_qkv=0.5: mlx-lm's olmoe never clips"),
        (
            {"rope_parameters": dict(YARN, attention_factor=2.0)},
            "rope_parameters.attention_factor=2.0",
        ),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)
