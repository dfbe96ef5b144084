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

from edge0.families.base import LogitsTopK

_FUSED = re.compile(
    r"^.*layers\.(?P<layer>\d+)\.block_sparse_moe\.(?P<kind>input_linear|output_linear)\.weight$"
)


class GraniteMoe(LogitsTopK):
    name = "granitemoe"
    model_types: ClassVar[dict[str, str]] = {"granitemoe": "granitemoe"}
    expert_keys = ("num_local_experts",)
    block_attr = "block_sparse_moe"
    router_attr = "router.layer"
    routing = "top-k of logits, softmax over the k (fp32)"

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
