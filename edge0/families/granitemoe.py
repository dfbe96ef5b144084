"""Granite-MoE (granitemoe): top-k of the router logits, softmax over the k (fp32); no shared.

The router is `block_sparse_moe.router` wrapping its linear `router.layer` and keeping
`top_k`. Experts are fused in the HF checkpoint: `block_sparse_moe.input_linear.weight`
(E, 2F, d), gate the first half, up the second, and `output_linear.weight` (E, d, F);
mlx-lm splits them into `block_sparse_moe.switch_mlp`. The embedding, attention,
residual and logits multipliers live outside the sparse block (mlx-lm's model).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.families import tiny
from edge0.families.audit import (
    EXPERTS,
    ROPE,
    TIED_OK,
    Fields,
    computed,
    derived_head_dim,
    edge0,
    where,
)
from edge0.families.probes import LLAMA3
from edge0.families.shared import LogitsTopK

_FUSED = re.compile(
    r"^.*layers\.(?P<layer>\d+)\.block_sparse_moe\.(?P<kind>input_linear|output_linear)\.weight$"
)
GRANITE = "Granite's scaling; mlx-lm's granitemoe takes it (golden-tested in the family fixture)"


def _tiny(vocab: int) -> Any:
    from transformers import GraniteMoeConfig

    # experts 64 wide: mlx-lm quantizes their down_proj at 8 bits in groups of 64 (its predicate)
    return GraniteMoeConfig(
        **tiny.common(vocab),
        intermediate_size=2 * tiny.FF,
        num_key_value_heads=tiny.KV,
        num_local_experts=8,
        num_experts_per_tok=2,
        embedding_multiplier=12.0,
        logits_scaling=8.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0625,
    )


def _granite_31_3b_a800m() -> Any:
    from transformers import GraniteMoeConfig

    return GraniteMoeConfig(
        vocab_size=49155,
        hidden_size=1536,
        intermediate_size=512,
        num_hidden_layers=32,
        num_attention_heads=24,
        num_key_value_heads=8,
        num_local_experts=40,
        num_experts_per_tok=8,
        max_position_embeddings=131072,
        embedding_multiplier=12.0,
        logits_scaling=6.0,
        residual_multiplier=0.22,
        attention_multiplier=0.015625,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7},
        dtype="bfloat16",
    )


class GraniteMoe(LogitsTopK):
    name = "granitemoe"
    model_types: ClassVar[dict[str, str]] = {"granitemoe": "granitemoe"}
    expert_keys = ("num_local_experts",)
    block_attr = "block_sparse_moe"
    router_attr = "router.layer"
    routing = "top-k of logits, softmax over the k (fp32)"

    fields: ClassVar[Fields] = {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": ROPE,
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "transformers' granitemoe sizes its heads hidden_size // heads and its rope by "
            "head_dim: another head_dim fails in its attention",
        ),
        "embedding_multiplier": computed(GRANITE),
        "attention_multiplier": computed(GRANITE),
        "residual_multiplier": computed(GRANITE),
        "logits_scaling": computed(GRANITE),
        "tie_word_embeddings": computed(TIED_OK),
    }

    flagships: ClassVar[dict[str, Any]] = {"granite-3.1-3b-a800m": _granite_31_3b_a800m}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "attention_bias": {"attention_bias": True},
        "tied": {"tie_word_embeddings": True},
        "gelu": {"hidden_act": "gelu"},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "attention_bias": True,
            "tie_word_embeddings": True,
            "rope_parameters": dict(LLAMA3),
            "hidden_act": "gelu",
        },
    }
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"head_dim": 32}, "head_dim=32: transformers' granitemoe sizes its heads"),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def fused_expert(self, name: str) -> tuple[int, str] | None:
        m = _FUSED.match(name)
        return None if m is None else (int(m["layer"]), m["kind"])

    def read_fused(self, read: Any, keys: set[str], expert: int) -> dict[str, Any]:
        both, dtype = read("input_linear", expert)  # (2F, d): gate rows, then up rows
        down, down_dtype = read("output_linear", expert)  # (d, F)
        half = both.shape[0] // 2
        return {
            "gate_proj": (np.ascontiguousarray(both[:half]), dtype),
            "up_proj": (np.ascontiguousarray(both[half:]), dtype),
            "down_proj": (down, down_dtype),
        }

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        return mx.softmax(mx.take_along_axis(scores, inds, axis=-1).astype(mx.float32), axis=-1)

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return y.astype(x.dtype)  # fp32 gate weights, summed, cast back as mlx-lm does

    def top_k(self, block: nn.Module) -> int:
        return int(block.router.top_k)

    def set_top_k(self, block: nn.Module, k: int) -> None:
        block.router.top_k = k
