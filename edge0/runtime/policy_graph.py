"""The available-first choice made in the graph: a masked top-K over the staged candidates.

The host knows, without reading anything back, which experts of a layer sit ready in
a slot when the layer is built (the slot table is host state): the predicted set
(staged for this step; compute waits for it as `predicted` does), the wider
prediction's RAM-cached experts staged with it (`DeviceChoice.width`), and a few
slots still holding the layer's experts of earlier steps. Those candidates go to
the device as a (E,) mask and a (E,) expert->slot lookup; the graph ranks the
experts as the host policy does (the family's true top-K first, in the router's
order, then by true score), keeps the K best candidates, takes their gate weights
from the true scores (the router's own weights when the chosen set is the true
top-K) and gathers their slots. No host sync beyond `predicted`'s: the chosen set
is read back with the layer's deferred group (edge0.runtime.syncs), for the
recall and the next step's prediction inputs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import mlx.core as mx

from edge0.runtime.slots import SlotState

if TYPE_CHECKING:
    import mlx.nn as nn

    from edge0.routing.families import Family
    from edge0.runtime.layers import LayerStream

WIDTH = 2  # the wider prediction: WIDTH x K experts per layer, its cached ones staged


def wide_k(k: int, n_experts: int) -> int:
    """Experts per layer of the wider prediction whose RAM-cached ones are staged."""
    return min(n_experts, WIDTH * k)


def choose_graph(
    family: Family, block: nn.Module, scores: mx.array, true_inds: mx.array, w_true: mx.array,
    allowed: mx.array, k: int,
) -> tuple[mx.array, mx.array]:  # fmt: skip
    """(inds (1, 1, k), gate weights (1, 1, k)): the k best experts where `allowed` ((E,) bool,
    at least k set): the true top-K first, then by true score; the router's own indices and
    weights when the choice is the true top-K (bit-identical to exact routing). A dozen
    small ops: on the CPU their dispatch, not their arithmetic, is the cost."""
    s, t = scores.reshape(-1), true_inds.reshape(-1)
    is_true = (t[:, None] == mx.arange(s.shape[0], dtype=t.dtype)[None, :]).any(axis=0)
    key = mx.where(allowed, mx.where(is_true, math.inf, s), -math.inf)
    chosen = mx.argpartition(-key, kth=k - 1)[:k].astype(t.dtype).reshape(true_inds.shape)
    exact = allowed[t].all()
    inds = mx.where(exact, true_inds, chosen)
    return inds, mx.where(exact, w_true, family.weights(block, scores, chosen))


class DeviceChoice:
    """Per routed layer-step: the candidates (host), the choice (graph), the slot index."""

    def candidates(self, stream: LayerStream, planned: list[int]) -> list[int]:
        """The predicted set, then the wider prediction's experts that are in a slot or in the
        RAM cache: those are copied into free slots here, on the compute thread (a record copy,
        no trip through the event loop), and all are pinned for this step (no prefetch may
        take their slots before the layer's graph has run). Other slots still holding the
        layer's experts are not candidates: pinning them starved the next step's prefetches."""
        steps, layer = stream.steps, stream.layer
        sched = steps.scheduler
        assert sched is not None, "Steps.attach(scheduler) was not called"
        have = set(planned)
        extras = [e for e in stream.extras_for(steps.step) if e not in have]
        if extras:  # in a slot (reserved) or in the RAM cache (copied into one, here)
            servable = sched.servable(layer, extras)
            extras = [e for e in extras if e in servable]
            sched.keep(layer, steps.step, extras)
        table = sched.table
        where = table.where[layer]  # changed only on this (the compute) thread
        extras = [e for e in extras if e in where and table.state(where[e]) is SlotState.READY]
        return list(planned) + extras

    def graph(
        self, block: nn.Module, family: Family, scores: mx.array, true_inds: mx.array,
        w_true: mx.array, cands: list[int], k: int,
    ) -> tuple[mx.array, mx.array]:  # fmt: skip
        mask = [False] * scores.shape[-1]
        for e in cands:
            mask[e] = True
        return choose_graph(family, block, scores, true_inds, w_true, mx.array(mask), k)

    def slots(
        self, stream: LayerStream, cands: list[int], chosen: mx.array, n_experts: int
    ) -> mx.array:
        """(1, 1, K) slot indices of the chosen experts (blocks until the candidates are
        staged: the predicted ones may still be loading, as under `predicted`)."""
        got = stream.acquire(cands)
        lookup = [0] * n_experts
        for e, s in zip(cands, got, strict=True):
            lookup[e] = s
        return mx.array(lookup, dtype=mx.uint32)[chosen]
