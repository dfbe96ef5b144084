"""Mixtral: top-k of the router logits, then softmax over the selected logits; no shared expert.

Experts are `block_sparse_moe.experts.E.{w1,w3,w2}.weight` (gate, up, down), one
tensor per expert; mlx-lm stacks them into `block_sparse_moe.switch_mlp`.
"""

from __future__ import annotations

from typing import ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families.base import Family


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

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return self.router_logits(block, x)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        return mx.softmax(mx.take_along_axis(scores, inds, axis=-1), axis=-1, precise=True)
