"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): softmax, top-k, plus a sigmoid-gated shared expert.

mlx-lm's block never renormalises the top-k and makes every layer sparse, so a
config asking for `norm_topk_prob`, `mlp_only_layers` or `decoder_sparse_step` > 1
is refused rather than run differently from transformers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError
from edge0.families import tiny
from edge0.families.audit import (
    SHAPE,
    Fields,
    Rope,
    computed,
    derived_head_dim,
    edge0,
    irrelevant,
    only,
    where,
)
from edge0.families.base import Family, sigmoid_gated_shared

EVERY = "mlx-lm's qwen2_moe makes every layer sparse"


def _tiny(vocab: int) -> Any:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **tiny.common(vocab),
        intermediate_size=2 * tiny.FF,
        num_key_value_heads=tiny.KV,
        moe_intermediate_size=tiny.FF,
        shared_expert_intermediate_size=tiny.FF,
        num_experts=8,
        num_experts_per_tok=2,
    )


def _qwen15_moe_a27b() -> Any:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=5632,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_experts=60,
        num_experts_per_tok=4,
        norm_topk_prob=False,
        max_position_embeddings=8192,
        dtype="bfloat16",
    )


class Qwen2Moe(Family):
    name = "qwen2_moe"
    model_types: ClassVar[dict[str, str]] = {"qwen2_moe": "qwen2_moe"}
    routing = "softmax, top-k (no renormalisation)"
    shared = "sigmoid-gated"

    fields: ClassVar[Fields] = {
        "decoder_sparse_step": only(1, why=EVERY),
        "mlp_only_layers": only([], why=EVERY),
        "norm_topk_prob": only(False, why="mlx-lm's qwen2_moe never renormalises the top-k"),
        "qkv_bias": only(True, why="mlx-lm's qwen2_moe always has q/k/v biases"),
        "moe_intermediate_size": computed(SHAPE + " (experts)"),
        "shared_expert_intermediate_size": computed(SHAPE + " (sigmoid-gated shared expert)"),
        "num_experts": edge0("routed experts per sparse layer (the expert records)"),
        "rope_parameters": Rope(
            ("default",),
            "mlx-lm's qwen2_moe builds a plain RoPE from rope_theta and drops any scaling",
        ),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "mlx-lm's qwen2_moe takes hidden_size // heads",
        ),
        "tie_word_embeddings": only(False, why="mlx-lm's qwen2_moe always has its own lm_head"),
        "use_sliding_window": edge0("switches sliding windows on; checked through layer_types"),
        "max_window_layers": edge0("which layers slide; checked through layer_types"),
        "sliding_window": irrelevant("applies to layer_types' sliding_attention layers only"),
        "layer_types": where(
            lambda v, _: v is None or all(t == "full_attention" for t in v),
            "full_attention on every layer",
            "mlx-lm's qwen2_moe attends over the whole context (no sliding window)",
        ),
        "rope_traditional": only(None, False, why="transformers rotates halves, never pairs"),
    }

    flagships: ClassVar[dict[str, Any]] = {"qwen1.5-moe-a2.7b": _qwen15_moe_a27b}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "no_qkv_bias": {"qkv_bias": False},
        "sliding_window": {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 3},
        "head_dim": {"head_dim": 32},
        "tied": {"tie_word_embeddings": True},
        "gelu": {"hidden_act": "gelu"},
    }
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"tie_word_embeddings": True}, "tie_word_embeddings=true: mlx-lm's qwen2_moe"),
        ({"qkv_bias": False}, "qkv_bias=false: mlx-lm's qwen2_moe always has"),
        (
            {"layer_types": ["sliding_attention", "full_attention", "full_attention"]},
            'layer_types=["sliding_attention"',
        ),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        if tc.get("norm_topk_prob"):
            raise ModelLoadError(
                "qwen2_moe with norm_topk_prob=true: mlx-lm's qwen2_moe never renormalises "
                "the top-k weights, so it would not compute this model"
            )
        if tc.get("mlp_only_layers") or int(tc.get("decoder_sparse_step") or 1) != 1:
            raise ModelLoadError(
                "qwen2_moe with dense layers (mlp_only_layers / decoder_sparse_step > 1): "
                "mlx-lm's qwen2_moe makes every layer sparse, so it would not compute this model"
            )
        return tc

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return sigmoid_gated_shared(block, x, y)
