"""Host syncs of route mode: the layers' host work deferred and evaluated in groups of G layers
(docs/runtime.md, "Host syncs and reads that are never used").
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Protocol

import attrs
import mlx.core as mx


class Counts(Protocol):
    syncs: int  # host syncs of the step (edge0.runtime.layers.clock.StepRecord)


class SyncClock(Protocol):
    """What the groups read of the step clock (edge0.runtime.layers.clock.Clock)."""

    @property
    def step(self) -> int: ...

    def evaluated(self, layer: int | None) -> AbstractContextManager[None]:
        """Every graph of the step before `layer` ran; the slot work inside is deferred."""
        ...

    @property
    def cur(self) -> Counts: ...

    def span(self, kind: str, layer: int, start: float, end: float, cpu: float = 0.0) -> None: ...


class Finishing(Protocol):
    """A layer's stream, which finishes its deferred work (edge0.runtime.layers.streams)."""

    @property
    def layer(self) -> int: ...

    def finish(self, work: Deferred) -> None: ...


class Issuing(Protocol):
    """The prediction a layer owns, handed on once read back (streams.Lookahead)."""

    def issue(
        self,
        x: mx.array,
        experts: list[int],
        true: list[int],
        prev: list[int] | None,
        graph: mx.array | None,
        k: int,
    ) -> None: ...


@attrs.define(slots=True)
class Deferred:
    """One layer's host work of one step: the arrays to read back and what to do with them."""

    stream: Finishing
    x: mx.array
    true_inds: mx.array | None  # read back when the routing is recorded or a host predictor asks
    pred: mx.array | None  # the owned prediction graph
    experts: list[int] | None  # the set computed (None: the true set, once read back)
    prev: list[int] | None  # the set of the previous step
    head: Issuing | None  # the prediction to hand on (None: none this step)
    chosen: mx.array | None = None  # the set an in-graph route policy chose (policy_graph)

    def arrays(self) -> list[mx.array]:
        # x too: once it is evaluated, so is every earlier layer of the step (the slot fence)
        return [a for a in (self.x, self.true_inds, self.pred, self.chosen) if a is not None]


class SyncGroups:
    """Deferred layer work of one step, evaluated asynchronously every `every` layers."""

    def __init__(self, every: int, steps: SyncClock) -> None:
        self.every = every
        self.steps = steps
        self.pending: list[Deferred] = []
        self.inflight: list[Deferred] = []

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.inflight)

    def add(self, work: Deferred) -> None:
        self.pending.append(work)
        if len(self.pending) >= self.every:
            self.launch()

    def launch(self) -> None:
        """Start evaluating the pending group; complete the group launched before it."""
        self.complete()
        arrays = [a for w in self.pending for a in w.arrays()]
        if arrays:  # graph walk and scheduling happen on this thread: MLX's work, as an eval
            t0, c0 = time.perf_counter(), time.thread_time()
            mx.async_eval(arrays)
            self.steps.span("eval", -1, t0, time.perf_counter(), time.thread_time() - c0)
        self.inflight, self.pending = self.pending, []

    def complete(self) -> None:
        """Wait for the group in flight (one host sync) and issue its layers' prefetches."""
        group, self.inflight = self.inflight, []
        if group:
            self._finish(group, [])

    def flush(self, extra: list[mx.array]) -> None:
        """Evaluate everything deferred with `extra` (the step fence's outputs): one sync."""
        group, self.inflight, self.pending = self.inflight + self.pending, [], []
        self._finish(group, extra)

    def _finish(self, group: list[Deferred], extra: list[mx.array]) -> None:
        steps = self.steps
        t0, c0 = time.perf_counter(), time.thread_time()
        mx.eval([a for w in group for a in w.arrays()] + extra)
        steps.span("eval", -1, t0, time.perf_counter(), time.thread_time() - c0)
        steps.cur.syncs += 1
        # the fence move (their inputs ran: earlier layers' slots are free) and the group's
        # prefetches: applied by the planner thread
        with steps.evaluated(group[-1].stream.layer if group else None):
            for work in group:
                work.stream.finish(work)
