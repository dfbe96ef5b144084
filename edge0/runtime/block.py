"""The streaming sparse-MoE block: the resident router, then gather_qmm over the slot table.

It replaces a model's sparse block (`layer.mlp`) and keeps every child of the
original except the routed experts (`switch_mlp`), under the same names, so
parameter paths of the router and shared expert do not change. Per call (one
token, one decode step) on the compute thread:
  1. router scores and the true top-K, evaluated (routing must be known);
  2. the expert set: the true top-K, or in `route` mode the set predicted one
     step earlier, with gate weights from the true scores (family rule);
  3. the predictor owned by this layer (evaluated with the routing: one eval per
     layer) names the next step's experts of its target layer; reads are issued;
  4. `acquire` blocks until this layer's slots are staged;
  5. gather_qmm over the slot views with an expert->slot index (same expert order
     as the resident block, so outputs are bit-identical for the same set).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import Edge0Error
from edge0.routing.families import Family

if TYPE_CHECKING:
    from edge0.runtime.runner import StreamContext


class StreamingMoE(nn.Module):
    """A sparse block whose routed experts live in slot memory, not in the model."""

    def __init__(self, original: nn.Module, layer: int, family: Family, ctx: StreamContext):
        super().__init__()
        for name, child in original.children().items():
            if name != "switch_mlp":
                setattr(self, name, child)
        for attr in ("norm_topk_prob", "top_k", "num_experts_per_tok", "num_experts"):
            if hasattr(original, attr):
                object.__setattr__(self, attr, getattr(original, attr))
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "ctx", ctx)
        object.__setattr__(self, "activation", original.switch_mlp.activation)

    def __call__(self, x: mx.array) -> mx.array:
        # x: (1, 1, d_model), the post-attention-norm hidden of one token
        if x.shape[0] == 1 and x.shape[1] > 1 and self.ctx.chunk is not None:
            from edge0.runtime.prefill import block_call

            return block_call(self, x)  # a prompt chunk (edge0.runtime.prefill)
        if x.shape[0] * x.shape[1] != 1:
            raise Edge0Error(
                f"the streaming block of layer {self.layer} runs one token per step, got input "
                f"shape {tuple(x.shape)}; feed tokens one at a time (the Engine does)"
            )
        ctx, fam, layer = self.ctx, self.family, self.layer
        scores = fam.scores(self, x)  # (1, 1, E)
        true_inds, w = fam.select(self, scores, ctx.top_k)  # (1, 1, K) each
        inds = true_inds
        planned = ctx.planned(layer)
        if planned is not None:  # route mode: the prediction is the routing
            inds = mx.array(planned, dtype=mx.uint32).reshape(1, 1, len(planned))
            w = fam.weights(self, scores, inds)
        pred = ctx.prediction_graph(layer, x, inds)  # (K,) next step's experts, lazy, or None
        t0, c0 = time.perf_counter(), time.thread_time()
        mx.eval([a for a in (true_inds, w, pred) if a is not None])  # one eval per layer
        ctx.span("eval", layer, t0, time.perf_counter(), time.thread_time() - c0)
        true: list[int] = true_inds.reshape(-1).tolist()
        experts = planned if planned is not None else true
        ctx.after_routing(layer, x, experts, true, inds, pred)
        if layer in ctx.resident_experts:  # a layer kept in memory: experts index themselves
            idx = inds
        else:
            slots = ctx.acquire(layer, experts)
            idx = mx.array(slots, dtype=mx.uint32).reshape(inds.shape)  # (1, 1, K) slot indices
        y = self._experts(x, idx)  # (1, 1, K, d_model)
        y = (y * w[..., None]).sum(axis=-2)
        return fam.extra(self, x, y)

    def _experts(self, x: mx.array, idx: mx.array) -> mx.array:
        views = self.ctx.resident_experts.get(self.layer) or self.ctx.memory.views[self.layer]
        q = self.ctx.quant
        h = mx.expand_dims(x, (-2, -3))  # (1, 1, 1, 1, d_model)

        def proj(name: str, inp: mx.array) -> Any:
            return mx.gather_qmm(
                inp,
                views[f"{name}.weight"],
                views[f"{name}.scales"],
                views[f"{name}.biases"],
                rhs_indices=idx,
                transpose=True,
                group_size=q["group_size"],
                bits=q["bits"],
                mode=q.get("mode", "affine"),
            )

        up = proj("up_proj", h)  # (1, 1, K, 1, d_ff)
        gate = proj("gate_proj", h)
        out = proj("down_proj", self.activation(up, gate))  # (1, 1, K, 1, d_model)
        return out.squeeze(-2)
