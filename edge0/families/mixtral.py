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
    ROPE,
    TIED_OK,
    Fields,
    checked,
    computed,
    edge0,
)
from edge0.families.base import Family
from edge0.families.probes import ROPES, YARN
from edge0.families.shared import slide
from edge0.model import attention, rope

NEEDS_HEAD_DIM = ("dynamic", "yarn", "longrope")  # transformers reads config.head_dim for them


def _head_dim_set(value: Any, cfg: dict[str, Any]) -> bool:
    return value is not None or rope.rope_type(cfg.get("rope_parameters")) not in NEEDS_HEAD_DIM


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
        "rope_parameters": ROPE,
        "sliding_window": computed(
            "every layer attends over its last sliding_window tokens, its KV cache keeps them "
            "(golden-tested at 4)"
        ),
        "head_dim": checked(
            _head_dim_set,
            "set when rope_type is dynamic, yarn or longrope",
            "q/k/v/o sized by it, hidden_size // heads when null (golden-tested); transformers "
            "builds a dynamic, yarn or longrope rope from it and fails when it is null",
        ),
        "tie_word_embeddings": computed(TIED_OK),
        "rope_traditional": edge0(HALVES),
    }

    flagships: ClassVar[dict[str, Any]] = {"mixtral-8x7b": _mixtral_8x7b}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        # transformers builds these ropes from head_dim: set (to hidden_size // heads)
        **{
            f"rope-{kind}": {"head_dim": tiny.HEAD_DIM, "rope_parameters": dict(ROPES[kind])}
            for kind in NEEDS_HEAD_DIM
        },
        "rope-dynamic": {
            "head_dim": tiny.HEAD_DIM,
            "rope_parameters": dict(ROPES["dynamic"]),
            "max_position_embeddings": 16,
        },
        "sliding_window": {"sliding_window": 4},
        "head_dim": {"head_dim": 32},
        "gelu": {"hidden_act": "gelu"},
        "tied": {"tie_word_embeddings": True},
        "jitter": {"router_jitter_noise": 0.1},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "tie_word_embeddings": True,
            "head_dim": 32,
            "sliding_window": 4,
            "rope_parameters": dict(ROPES["llama3"]),
        },
    }
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        (
            {"rope_parameters": dict(YARN)},
            "head_dim=null is invalid: mixtral's head_dim must be set",
        ),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def windows(self, tc: dict[str, Any]) -> list[int | None]:
        return [tc.get("sliding_window")] * int(tc["num_hidden_layers"])

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """An explicit head_dim and a sliding window, which mlx-lm's mixtral lacks."""
        d, heads, kv = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"]
        head_dim = int(tc.get("head_dim") or d // heads)
        if head_dim != d // heads:
            for layer in model.layers:
                attention.resize_heads(layer.self_attn, head_dim, heads, kv)
        slide(model, self.windows(tc))

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return self.router_logits(block, x)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        return mx.softmax(mx.take_along_axis(scores, inds, axis=-1), axis=-1, precise=True)
