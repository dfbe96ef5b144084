"""DeepSeek-V3 / Kimi-K2 / Moonlight: sigmoid scores, correction bias, group-limited top-k.

Selection ranks sigmoid(logits) + e_score_correction_bias within the best
`topk_group` of `n_group` groups (a group scores by its top two); gate weights are
the plain sigmoid scores of the set, renormalised with norm_topk_prob, times
routed_scaling_factor. Shared experts are added ungated. The first
`first_k_dense_replace` layers (and layers off `moe_layer_freq`) are dense.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families.base import Family, dense_first_then_sparse


class DeepseekV3(Family):
    name = "deepseek_v3"
    # Kimi-K2 is DeepSeek-V3's architecture under its own model_type (mlx-lm remaps it)
    model_types: ClassVar[dict[str, str]] = {"deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3"}
    expert_keys = ("n_routed_experts",)
    routing = "sigmoid + correction bias, group-limited top-k, renormalised, scaled"
    shared = "ungated (n_shared_experts)"

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        # transformers always routes noaux_tc over sigmoids whatever these (mlx-lm's) keys say
        tc["topk_method"], tc["scoring_func"] = "noaux_tc", "sigmoid"
        return tc

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        return dense_first_then_sparse(tc)

    def router_logits(self, block: nn.Module, x: mx.array) -> mx.array:
        out: mx.array = x @ block.gate.weight.T
        return out

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return self.router_logits(block, x)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        from mlx_lm.models.deepseek_v3 import group_expert_select

        g = block.gate
        inds, w = group_expert_select(
            scores,
            g.e_score_correction_bias,
            k,
            g.n_group,
            g.topk_group,
            g.routed_scaling_factor,
            g.norm_topk_prob,
        )
        return inds, w

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        g = block.gate
        w = mx.take_along_axis(mx.sigmoid(scores.astype(mx.float32)), inds, axis=-1)
        if inds.shape[-1] > 1 and g.norm_topk_prob:
            w = w / w.sum(axis=-1, keepdims=True)
        return w * g.routed_scaling_factor

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        y = y.astype(x.dtype)  # the block sums fp32 gate weights, then casts back
        if "shared_experts" in block:
            return y + block.shared_experts(x)
        return y
