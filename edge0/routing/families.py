"""Routing families: how a sparse block turns router logits into experts and gate weights.

Each family reproduces its mlx-lm block's arithmetic op for op, so a streamed
layer computes bit-identical outputs to the resident one when it runs the same
experts. `weights` gives the gate weights of a *given* expert set (route mode):
the family's own rule applied to the true router scores of that set.
"""

from __future__ import annotations

from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn


class Family(Protocol):
    name: str

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        """Router scores (..., E) of `x` (probabilities, logits or sigmoids per family)."""
        ...

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        """The true top-k: (inds (..., k), gate weights (..., k))."""
        ...

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        """Gate weights (..., k) of the expert set `inds` under this family's rule."""
        ...

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        """Add what the block adds besides routed experts (shared expert, casts)."""
        ...


class SoftmaxTopK:
    """qwen3_moe, qwen3_next, qwen3_5_moe: softmax over all experts, then top-k.

    With norm_topk_prob the selected probabilities are renormalised over the set.
    The qwen3_next/qwen3_5 block adds a sigmoid-gated shared expert.
    """

    name = "softmax_topk"

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return mx.softmax(block.gate(x), axis=-1, precise=True)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        inds = mx.argpartition(scores, kth=-k, axis=-1)[..., -k:]
        return inds, self.weights(block, scores, inds)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        w = mx.take_along_axis(scores, inds, axis=-1)
        if getattr(block, "norm_topk_prob", False):
            w = w / mx.sum(w, axis=-1, keepdims=True)
        return w

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        if "shared_expert" in block:
            shared = block.shared_expert(x)
            return y + mx.sigmoid(block.shared_expert_gate(x)) * shared
        return y


class TopKSoftmax:
    """mixtral: top-k of the logits, then softmax over the selected logits."""

    name = "topk_softmax"

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return block.gate(x)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        inds = mx.argpartition(-scores, kth=k - 1, axis=-1)[..., :k]
        return inds, self.weights(block, scores, inds)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        return mx.softmax(mx.take_along_axis(scores, inds, axis=-1), axis=-1, precise=True)

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return y


class SigmoidGrouped:
    """deepseek_v3 family: sigmoid scores plus a correction bias, group-limited top-k.

    Thin: the selection calls mlx-lm's `group_expert_select`; route-mode weights
    are the sigmoid scores of the set, renormalised when the model does, scaled by
    `routed_scaling_factor`. Not covered by exactness tests (no tiny fixture yet).
    """

    name = "sigmoid_grouped"

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return x @ block.gate.weight.T

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        from mlx_lm.models.deepseek_v3 import group_expert_select

        g = block.gate
        inds, w = group_expert_select(
            scores, g.e_score_correction_bias, k, g.n_group, g.topk_group,
            g.routed_scaling_factor, g.norm_topk_prob,
        )  # fmt: skip
        return inds, w

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        g = block.gate
        w = mx.take_along_axis(mx.sigmoid(scores.astype(mx.float32)), inds, axis=-1)
        if inds.shape[-1] > 1 and g.norm_topk_prob:
            w = w / w.sum(axis=-1, keepdims=True)
        return w * g.routed_scaling_factor

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        if "shared_experts" in block:
            return y + block.shared_experts(x)
        return y


FAMILIES: dict[str, Any] = {
    "qwen3_moe": SoftmaxTopK,
    "qwen3_next": SoftmaxTopK,
    "qwen3_5_moe": SoftmaxTopK,
    "qwen3_5_moe_text": SoftmaxTopK,
    "olmoe": SoftmaxTopK,
    "mixtral": TopKSoftmax,
    "deepseek_v3": SigmoidGrouped,
}


def family_for(model_type: str) -> Family:
    from edge0.errors import ModelLoadError

    cls = FAMILIES.get(model_type)
    if cls is None:
        raise ModelLoadError(
            f"no streaming MoE block for model_type {model_type!r}; "
            f"supported routing families cover: {', '.join(sorted(FAMILIES))}"
        )
    fam: Family = cls()
    return fam
