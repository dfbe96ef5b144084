"""The streaming sparse-MoE block: the model's resident parts and the experts' FFN over the slot
table; the step under way runs it (docs/runtime.md, "One decode step, one streamed layer").
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from edge0.families import Family
from edge0.kernels.ops import expert_ffn as native_expert_ffn
from edge0.layout.records import projection_quant
from edge0.runtime.layers.streams import LayerStream


class StreamingMoE(nn.Module):
    """A sparse block whose routed experts live in slot memory, not in the model."""

    def __init__(self, original: nn.Module, layer: int, family: Family, stream: LayerStream):
        super().__init__()
        for name, child in original.children().items():
            if name != family.switch_attr:
                setattr(self, name, child)
        for attr in ("norm_topk_prob", "top_k", "num_experts_per_tok", "num_experts"):
            if hasattr(original, attr):
                object.__setattr__(self, attr, getattr(original, attr))
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "stream", stream)
        object.__setattr__(self, "activation", original[family.switch_attr].activation)
        object.__setattr__(self, "_plan", None)  # (views, ffn_plan of them)
        object.__setattr__(self, "_weighted_sum", None)  # compiled at first use

    def __call__(self, x: mx.array) -> mx.array:
        # the step under way runs the block: one token, a prompt chunk or a batched step
        return self.stream.steps.executor.forward(self, x)

    def weighted_sum(self, scores: mx.array, inds: mx.array, y: mx.array) -> mx.array:
        """`family.combine(y, family.weights(self, scores, inds))`: the gate weights of the
        set `inds` (1, 1, K) and the weighted sum of its outputs y (1, 1, K, d), compiled once:
        the same ops, their element-wise ones and broadcasts fused (2 graph nodes fewer a
        layer, and no Python per op). The block's arrays are the function's implicit inputs."""
        fn = self._weighted_sum
        if fn is None:
            fam = self.family

            def gate_sum(scores: mx.array, inds: mx.array, y: mx.array) -> mx.array:
                return fam.combine(y, fam.weights(self, scores, inds))

            fn = mx.compile(gate_sum, inputs=self.state)
            object.__setattr__(self, "_weighted_sum", fn)
        out: mx.array = fn(scores, inds, y)
        return out

    def routed_ffn(self, x: mx.array, idx: mx.array) -> mx.array:
        """The routed experts' FFN of one token's `x` over the slots (or experts) `idx`."""
        # (1, 1, 1, 1, d_model), or (1, 1, K, 1, d_model): an input per expert (Llama-4 top-k)
        h = mx.expand_dims(x, (-2, -3)) if x.ndim == idx.ndim else mx.expand_dims(x, -2)
        views = self.stream.views
        plan = self._plan
        if plan is None or plan[0] is not views:  # the slot views do not change: built once
            plan = (views, ffn_plan(self.stream.quant, views))
            object.__setattr__(self, "_plan", plan)
        out = expert_ffn(self, views, h, idx, plan=plan[1])  # (1, 1, K, 1, d_model)
        return out.squeeze(-2)


# one projection's arrays and quantization: weight, scales, biases, bias, group size, bits, mode
Proj = tuple[mx.array, mx.array, "mx.array | None", "mx.array | None", int, int, str]


def ffn_plan(quant: dict[str, Any], views: dict[str, mx.array]) -> tuple[Proj, Proj, Proj]:
    """The up, gate and down projections of `views`, looked up once (a decode step's layer
    reuses its slot views' plan: no per-call key formatting or quantization lookup)."""

    def one(name: str) -> Proj:
        q = projection_quant(quant, name)  # a projection may have its own bits
        return (
            views[f"{name}.weight"],
            views[f"{name}.scales"],
            views.get(f"{name}.biases"),  # none in mxfp4 records
            views.get(f"{name}.bias"),  # experts with biased projections
            q["group_size"],
            q["bits"],
            q["mode"],
        )

    return one("up_proj"), one("gate_proj"), one("down_proj")


def expert_ffn(
    block: StreamingMoE,
    views: dict[str, mx.array],
    h: mx.array,
    idx: mx.array,
    sorted_indices: bool = False,
    plan: tuple[Proj, Proj, Proj] | None = None,
) -> mx.array:
    """The routed experts' gated FFN of `h` with the experts (slots) `idx`: one native op
    on the CPU (edge0.kernels), else three gather_qmm."""
    up_p, gate_p, down_p = plan or ffn_plan(block.stream.quant, views)
    fused = native_expert_ffn(h, idx, up_p, gate_p, down_p, block.activation)
    if fused is not None:
        return fused

    def proj(p: Proj, inp: mx.array) -> Any:
        w, scales, biases, bias, group_size, bits, mode = p
        out = mx.gather_qmm(
            inp,
            w,
            scales,
            biases,
            rhs_indices=idx,
            transpose=True,
            group_size=group_size,
            bits=bits,
            mode=mode,
            sorted_indices=sorted_indices,
        )
        return out if bias is None else out + mx.expand_dims(bias[idx], -2)

    up = proj(up_p, h)  # (..., d_ff)
    gate = proj(gate_p, h)
    return proj(down_p, block.activation(up, gate))  # (..., d_model)
