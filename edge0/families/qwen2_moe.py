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
from edge0.families.base import Family, sigmoid_gated_shared


class Qwen2Moe(Family):
    name = "qwen2_moe"
    model_types: ClassVar[dict[str, str]] = {"qwen2_moe": "qwen2_moe"}
    routing = "softmax, top-k (no renormalisation)"
    shared = "sigmoid-gated"

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
