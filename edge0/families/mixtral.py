"""Mixtral: top-k of the router logits, then softmax over the selected logits; no shared expert.

Experts are `block_sparse_moe.experts.E.{w1,w3,w2}.weight` (gate, up, down), one
tensor per expert; mlx-lm stacks them into `block_sparse_moe.switch_mlp`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families import tiny
from edge0.families.audit import (
    EXPERTS,
    HALVES,
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
from edge0.families.probes import LINEAR


def _tiny(vocab: int) -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        **tiny.common(vocab),
        intermediate_size=tiny.FF,
        num_key_value_heads=tiny.KV,
        num_local_experts=8,
        num_experts_per_tok=2,
    )


def _mixtral_8x7b() -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        dtype="bfloat16",
    )


class Mixtral(Family):
    name = "mixtral"
    model_types: ClassVar[dict[str, str]] = {"mixtral": "mixtral"}
    expert_keys = ("num_local_experts",)
    block_attr = "block_sparse_moe"
    hf_projections: ClassVar[dict[str, str]] = {
        "w1": "gate_proj",
        "w3": "up_proj",
        "w2": "down_proj",
    }
    routing = "top-k of logits, softmax over the k"

    fields: ClassVar[Fields] = {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": Rope(
            ("default",), "mlx-lm's mixtral builds a plain RoPE from rope_theta and drops scaling"
        ),
        "sliding_window": only(None, why="mlx-lm's mixtral attends over the whole context"),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "mlx-lm's mixtral takes hidden_size // heads",
        ),
        "tie_word_embeddings": computed(TIED_OK),
        "rope_traditional": only(None, False, why=HALVES),
    }

    flagships: ClassVar[dict[str, Any]] = {"mixtral-8x7b": _mixtral_8x7b}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "sliding_window": {"sliding_window": 4},
        "head_dim": {"head_dim": 32},
        "gelu": {"hidden_act": "gelu"},
        "tied": {"tie_word_embeddings": True},
        "jitter": {"router_jitter_noise": 0.1},
    }
    variant: ClassVar[dict[str, Any]] = {"tie_word_embeddings": True}
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"sliding_window": 4}, "sliding_window=4: mlx-lm's mixtral attends over the whole"),
        ({"rope_parameters": dict(LINEAR)}, 'rope_parameters.rope_type="linear"'),
        ({"head_dim": 32}, "head_dim=32: mlx-lm's mixtral takes hidden_size // heads"),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return self.router_logits(block, x)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        return mx.softmax(mx.take_along_axis(scores, inds, axis=-1), axis=-1, precise=True)
