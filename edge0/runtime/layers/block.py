"""The streaming sparse-MoE block: the resident router, then the experts over the slot table
(docs/runtime.md, "One decode step, one streamed layer").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import Edge0Error
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

    def __call__(self, x: mx.array) -> mx.array:
        # x: (1, 1, d_model), the post-attention-norm hidden of one token
        batch = self.stream.steps.batch
        if batch is not None:  # one row of a batched step waits for the batch's layer
            return batch.join(self, x)
        chunk = self.stream.steps.chunk
        if x.shape[0] == 1 and x.shape[1] > 1 and chunk is not None:
            return chunk.block_call(self, x)  # a prompt chunk (edge0.runtime.prefill.chunks)
        if x.shape[0] * x.shape[1] != 1:
            raise Edge0Error(
                f"the streaming block of layer {self.layer} runs one token per step, got input "
                f"shape {tuple(x.shape)}; feed tokens one at a time (the Engine does)"
            )
        stream, fam = self.stream, self.family
        scores = fam.scores(self, x)  # (1, 1, E)
        planned = stream.planned()
        true_inds: mx.array | None = None
        if planned is None or stream.needs_true():  # (1, 1, K) each
            true_inds, w = fam.select(self, scores, stream.top_k)
        policy = stream.steps.policy
        if planned is not None and policy is not None and policy.on_device:
            assert true_inds is not None  # (a route policy ranks by the true set)
            return self._choose_on_device(x, scores, true_inds, w, planned)
        if planned is not None:  # route mode: the prediction (or the route policy's choice)
            exact = False
            if true_inds is not None:
                planned, exact = stream.choose(x, scores, true_inds, planned)
            if exact:  # the true top-K: the router's own indices and weights
                assert true_inds is not None
                inds = true_inds
            else:
                inds = mx.array([[planned]], dtype=mx.uint32)  # (1, 1, K)
                w = fam.weights(self, scores, inds)
        else:
            assert true_inds is not None
            inds = true_inds
        # evaluated; the owned prediction's prefetch is read after this layer's own reads
        experts = stream.route(x, true_inds, inds, w, planned, hold=True)
        groups = stream.arrivals(experts)
        if groups is None:
            y = self._experts(fam.expert_input(x, w), stream.slots(experts, inds))
        else:
            y = self._arriving(fam.expert_input(x, w), groups, len(experts))
        return fam.extra(self, x, fam.combine(y, w))  # y: (1, 1, K, d)

    def _arriving(self, h: mx.array, groups: Iterator[list[tuple[int, int]]], k: int) -> mx.array:
        """The outputs (1, 1, k, d) of k experts computed group by group as their slots are
        ready: the first, when more follow, is launched (`mx.async_eval`) and computes while
        the rest are read. An expert's output does not depend on the others computed with
        it, and the outputs go back into routing order before the weighted sum: the same
        sum as in one op."""
        steps, layer = self.stream.steps, self.layer
        ys: list[mx.array] = []
        order: list[int] = []
        for group in groups:
            pos = [i for i, _ in group]
            idx = mx.array([[[s for _, s in group]]], dtype=mx.uint32)  # (1, 1, g)
            part = h if h.ndim == 3 else h[:, :, mx.array(pos, dtype=mx.uint32)]  # (1, 1, [g,] d)
            y = self._experts(part, idx)  # (1, 1, g, d)
            ys.append(y)
            order += pos
            if len(order) < k:  # more to come: this group computes while they are read
                t0 = time.perf_counter()
                mx.async_eval(y)
                steps.span("partial", layer, t0, time.perf_counter())
        y = mx.concatenate(ys, axis=-2) if len(ys) > 1 else ys[0]  # (1, 1, k, d), arrival order
        if order == list(range(k)):
            return y
        back = sorted(range(k), key=order.__getitem__)  # arrival index of each routing position
        return mx.take(y, mx.array(back, dtype=mx.uint32), axis=-2)

    def _choose_on_device(
        self, x: mx.array, scores: mx.array, true_inds: mx.array, w: mx.array, planned: list[int]
    ) -> mx.array:
        """Route mode under the in-graph available-first policy (edge0.runtime.layers.policy_graph):
        the set is chosen on the device among the staged candidates, no readback."""
        stream, fam = self.stream, self.family
        choice = stream.steps.policy.device
        cands = choice.candidates(stream, planned)
        inds, w = choice.graph(self, fam, scores, true_inds, w, cands, len(planned))
        stream.route(x, true_inds, inds, w, planned)  # deferred: read back with its group
        idx = choice.slots(stream, cands, inds, scores.shape[-1])
        y = self._experts(fam.expert_input(x, w), idx)  # (1, 1, K, d)
        return fam.extra(self, x, fam.combine(y, w))

    def _experts(self, x: mx.array, idx: mx.array) -> mx.array:
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
