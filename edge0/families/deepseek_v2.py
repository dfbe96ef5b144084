"""DeepSeek-V2 / V2-Lite: softmax, greedy or group-limited greedy top-k, scaled, not renormalised.

`group_limited_greedy` keeps the best `topk_group` of `n_group` groups (a group
scores by its best expert) before the top-k. Gate weights are the softmax
probabilities of the set times routed_scaling_factor (mlx-lm's block never
renormalises). Shared experts are added ungated; the first
`first_k_dense_replace` layers are dense.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ModelLoadError
from edge0.families.base import Family, dense_first_then_sparse


class DeepseekV2(Family):
    name = "deepseek_v2"
    model_types: ClassVar[dict[str, str]] = {"deepseek_v2": "deepseek_v2"}
    expert_keys = ("n_routed_experts",)
    routing = "softmax, (group-limited) greedy top-k, scaled"
    shared = "ungated (n_shared_experts)"

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        if tc.get("norm_topk_prob") and int(tc.get("num_experts_per_tok") or 1) > 1:
            raise ModelLoadError(
                "deepseek_v2 with norm_topk_prob=true: mlx-lm's deepseek_v2 never renormalises "
                "the top-k weights, so it would not compute this model"
            )
        if not tc.get("rope_scaling"):  # mlx-lm builds YaRN always; factor 1 is plain RoPE
            theta = (tc.get("rope_parameters") or {}).get("rope_theta", tc.get("rope_theta"))
            yarn = {
                "rope_type": "yarn",
                "factor": 1.0,
                "rope_theta": theta,
                "original_max_position_embeddings": tc.get("max_position_embeddings"),
            }
            tc["rope_scaling"] = tc["rope_parameters"] = yarn  # the same, said as YaRN
        return tc

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        return dense_first_then_sparse(tc)

    def router_logits(self, block: nn.Module, x: mx.array) -> mx.array:
        out: mx.array = x @ block.gate.weight.T
        return out

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        g = block.gate
        ranked = scores
        if g.topk_method == "group_limited_greedy":
            grouped = mx.unflatten(scores, axis=-1, shape=(g.n_group, -1))
            group_scores = grouped.max(axis=-1, keepdims=True)
            drop = g.n_group - g.topk_group
            group_idx = mx.argpartition(group_scores, kth=drop - 1, axis=-2)[..., :drop, :]
            grouped = mx.put_along_axis(grouped, group_idx, mx.array(0.0, scores.dtype), axis=-2)
            ranked = mx.flatten(grouped, -2, -1)
        inds = mx.argpartition(-ranked, kth=k - 1, axis=-1)[..., :k]
        return inds, self.weights(block, scores, inds)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        return mx.take_along_axis(scores, inds, axis=-1) * block.gate.routed_scaling_factor

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        if "shared_experts" in block:
            return y + block.shared_experts(x)
        return y
