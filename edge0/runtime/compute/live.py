"""The live feed: each step's reads and compute spans, collected only while someone watches and
handed on once per step, raw (docs/server.md, "The event stream").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import attrs

from edge0.log import get_logger
from edge0.runtime.compute.batch import BatchStep
from edge0.runtime.compute.steps import Steps
from edge0.runtime.io.tickets import FetchTicket
from edge0.runtime.io.trace import Tracer

log = get_logger("edge0.runtime.compute.live")

Span = tuple[str, int, float, float]  # kind, layer (-1: the step's own), start, end


@attrs.frozen
class StepTrace:
    """What one step did, as the compute thread saw it; summed up by whoever receives it."""

    request: int
    step: int
    prefill: bool
    batch: bool  # a batched decode step (several requests, one token each)
    started: float  # time.perf_counter() at the step's start
    wall: float  # the step's time on the compute thread (s)
    spans: list[Span]
    reads: list[FetchTicket]  # reads finished since the last hand-off, for any step
    asked: list[tuple[int, int, int]]  # per slot acquisition: layer, experts asked, found staged
    held: dict[int, int]  # layer -> experts in its slots at the step's end
    predicted: dict[int, list[int]]  # layer -> the set predicted for this step (exact modes)
    executed: dict[int, list[int]]  # layer -> the set it ran (the layers in `predicted`)
    recall: tuple[int, int]  # route mode: true experts run, out of the true top-K read back


class LiveFeed:
    """Watches the step clock and the tracer while attached; hands one StepTrace per step to
    `emit` (called on the compute thread: it must only hand the trace on, never block)."""

    def __init__(self, steps: Steps, tracer: Tracer, emit: Callable[[StepTrace], None]) -> None:
        self.steps = steps
        self.tracer = tracer
        self.emit = emit
        self._lock = threading.Lock()  # reads finish on reader threads (or the event loop)
        self._reads: list[FetchTicket] = []
        self._spans: list[Span] = []
        self._asked: list[tuple[int, int, int]] = []
        self._staged = (0, 0)  # the scheduler's (staged hits, misses) at the last acquisition
        self._predicted: dict[int, list[int]] = {}
        self._open = False  # a step began while attached (a half-seen step is not handed on)
        self._started = 0.0

    @property
    def attached(self) -> bool:
        return self.steps.watch is self

    def attach(self) -> None:
        """Start watching (from any thread): the next step that begins is the first handed on."""
        self.tracer.sink = self
        self.steps.watch = self

    def detach(self) -> None:
        """Stop watching: nothing more is collected, the step under way is dropped."""
        self.steps.watch = None
        self.tracer.sink = None
        self._open = False

    # --- the tracer's sink (reader threads and the compute thread) ---------------------------
    def read(self, ticket: FetchTicket) -> None:
        with self._lock:
            self._reads.append(ticket)

    def compute(self, kind: str, step: int, layer: int, start: float, end: float) -> None:
        self._spans.append((kind, layer, start, end))
        if kind == "wait" and layer >= 0:  # a slot acquisition just ended: what it found
            sched = self.steps.scheduler
            if sched is not None:
                hits, misses = sched.stats.staged_hits, sched.stats.staged_misses
                h0, m0 = self._staged
                self._staged = (hits, misses)
                self._asked.append((layer, hits - h0 + misses - m0, hits - h0))

    # --- the step clock's watch (the compute thread) -------------------------------------
    def begin(self) -> None:
        steps = self.steps
        self._open, self._started = True, time.perf_counter()
        self._spans, self._asked = [], []
        sched = steps.scheduler
        if sched is not None:
            self._staged = (sched.stats.staged_hits, sched.stats.staged_misses)
        now = steps.step
        self._predicted = {}
        if steps.mode != "route" and not isinstance(steps.executor, BatchStep):  # exact, one row
            self._predicted = {
                layer: experts for layer, (s, experts) in steps.predictions().items() if s == now
            }

    def end(self) -> None:
        if not self._open:
            return
        self._open = False
        steps = self.steps
        with self._lock:
            reads, self._reads = self._reads, []
        sched = steps.scheduler
        where = sched.table.where if sched is not None else {}
        executed: dict[int, list[int]] = {}
        for layer in self._predicted:
            ran = getattr(steps.layers.get(layer), "prev_experts", None)
            if ran is not None:
                executed[layer] = list(ran)
        cur = steps.cur
        trace = StepTrace(
            request=steps.request,
            step=cur.step,
            prefill=cur.prefill,
            batch=isinstance(steps.executor, BatchStep),
            started=self._started,
            wall=cur.wall,
            spans=self._spans,
            reads=reads,
            asked=self._asked,
            held={layer: len(experts) for layer, experts in where.items()},
            predicted=self._predicted,
            executed=executed,
            recall=(cur.recall_hits, cur.recall_slots),
        )
        try:
            self.emit(trace)
        except RuntimeError:  # the receiving loop closed: nobody is watching any more
            log.debug("live_feed_closed")
            self.detach()
