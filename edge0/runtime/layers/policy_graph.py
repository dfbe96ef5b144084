"""The available-first choice made in the graph: a masked top-K over the experts in slots
(docs/runtime.md, "Route policies", in the graph).
"""

from __future__ import annotations

import math
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn

from edge0.families import Family
from edge0.runtime.io.slots import pool_size
from edge0.runtime.layers.clock import Clock


class SlotStream(Protocol):
    """What the in-graph choice uses of a layer's stream (edge0.runtime.layers.streams)."""

    @property
    def layer(self) -> int: ...

    @property
    def steps(self) -> Clock: ...

    def acquire(self, experts: list[int]) -> list[int]: ...


POOL_WIDTH = 8  # the pool holds up to 8K experts per layer (the candidates' cache) ...
POOL_EXTRA_BYTES = 64 << 20  # ... in at most this many bytes of slots beyond the usual pool


def pool_slots(base: int, k: int, n_experts: int, layers: int, record_size: int) -> int:
    """Slots of the pool under the in-graph choice: `base` (the usual pool) grown towards
    POOL_WIDTH x K experts per layer (never past every expert), by at most POOL_EXTRA_BYTES."""
    want = min(pool_size(POOL_WIDTH * k, layers), n_experts * layers + base)
    return max(base, min(want, base + POOL_EXTRA_BYTES // max(1, record_size)))


def choose_graph(
    family: Family,
    block: nn.Module,
    scores: mx.array,
    true_inds: mx.array,
    w_true: mx.array,
    allowed: mx.array,
    k: int,
) -> tuple[mx.array, mx.array]:
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

    def candidates(self, stream: SlotStream, planned: list[int]) -> list[int]:
        """The predicted set, then every other expert of the layer ready in a slot, pinned for
        this step (one scheduler call, no reads: no prefetch may take their slots before the
        layer's graph has run)."""
        steps, layer = stream.steps, stream.layer
        sched = steps.scheduler
        assert sched is not None, "Steps.attach(scheduler) was not called"
        return list(planned) + sched.prefetch(layer, steps.step, planned, staged=True)

    def graph(
        self,
        block: nn.Module,
        family: Family,
        scores: mx.array,
        true_inds: mx.array,
        w_true: mx.array,
        cands: list[int],
        k: int,
    ) -> tuple[mx.array, mx.array]:
        mask = [False] * scores.shape[-1]
        for e in cands:
            mask[e] = True
        return choose_graph(family, block, scores, true_inds, w_true, mx.array(mask), k)

    def slots(
        self, stream: SlotStream, cands: list[int], chosen: mx.array, n_experts: int
    ) -> mx.array:
        """(1, 1, K) slot indices of the chosen experts (blocks until the candidates are
        staged: the predicted ones may still be loading, as under `predicted`)."""
        got = stream.acquire(cands)
        lookup = [0] * n_experts
        for e, s in zip(cands, got, strict=True):
            lookup[e] = s
        return mx.array(lookup, dtype=mx.uint32)[chosen]
