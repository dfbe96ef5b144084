"""The step clock of one model's streaming layers: counters, request and step boundaries, the
executor each step hands its blocks, per-step timings, the step fence (docs/runtime.md,
"One decode step").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import mlx.core as mx

from edge0.routing.predictors import Predictor
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.source import ClockSource, ExpertSource
from edge0.runtime.io.trace import Tracer
from edge0.runtime.layers.clock import MoEExecutor, StepRecord
from edge0.runtime.layers.policy import RoutePolicy
from edge0.runtime.layers.single import OnDeviceToken, SingleToken
from edge0.runtime.layers.syncs import SyncGroups
from edge0.runtime.layers.width import Width

__all__ = ["StepRecord", "Steps", "Stream"]


class Stream(Protocol):
    """What the clock needs of a layer's stream (edge0.runtime.layers.streams.LayerStream)."""

    @property
    def plan(self) -> tuple[int, list[int]] | None: ...

    def reset(self) -> None: ...

    def attach(self, scheduler: ExpertSource) -> None: ...


class StepWatch(Protocol):
    """Told of each step's start and end on the compute thread (edge0.runtime.compute.live)."""

    def begin(self) -> None: ...

    def end(self) -> None: ...


class Steps:
    """The step clock of one model's streaming layers: counters, request boundaries, timings.

    `mode`, `top_k` and `predictor` are what the engine was built with (for the
    stats); the layers' behaviour was chosen when they were built, not here.
    """

    def __init__(
        self,
        mode: str,
        top_k: int,
        tracer: Tracer,
        predictor: Predictor | None = None,
        memory: SlotMemory | None = None,
    ) -> None:
        self.mode = mode
        self.top_k = top_k
        self.tracer = tracer
        self.predictor = predictor
        self.memory = memory
        self.scheduler: ClockSource | None = None
        self.layers: dict[int, Stream] = {}  # model layer -> its stream (streaming blocks)
        self.step = -1  # global step counter (fences use it)
        self.pos = -1  # position within the current request
        self.prefill = False
        self.prefetching = False  # this step's predictions are used by the next step
        self.groups: SyncGroups | None = None  # route mode, --sync-every G > 1
        self.request = 0
        self.routed_by_prediction = 0  # layer-steps whose routing was the prediction
        self.recording: dict[tuple[int, int], list[int]] | None = None  # (pos, layer) -> true set
        # layers whose experts stay in memory (first-layer policy "resident"): field -> (E, ...)
        self.resident_experts: dict[int, dict[str, mx.array]] = {}
        self.records: list[StepRecord] = []
        self.cur = StepRecord(-1, True)
        self.prefill_chunk = 1  # prompt tokens per forward (edge0.runtime.prefill.chunks)
        self.policy: RoutePolicy | None = None  # route mode's policy; None: the prediction
        self.token: MoEExecutor = SingleToken()  # how a one-token step runs a streaming block
        self.executor: MoEExecutor = self.token  # ... and how the step under way runs it
        self.watch: StepWatch | None = None  # set only while someone watches the steps
        self.width: Width | None = None  # hint: the prefetch width (fixed, or measured)

    def use_policy(self, policy: RoutePolicy) -> None:
        """Route mode's policy (at setup); an in-graph one brings its own one-token executor."""
        self.policy = policy
        self.token = OnDeviceToken(policy.device) if policy.on_device else SingleToken()
        self.executor = self.token

    def count_recall(self, used: list[int], true: list[int]) -> None:
        """A routed layer ran `used` where the true top-K was `true` (recall of the true set)."""
        self.cur.recall_hits += len(set(used) & set(true))
        self.cur.recall_slots += len(true)

    def attach(self, scheduler: ClockSource) -> None:
        """Give the layers' slot acquisition and prefetch the scheduler (built after the model)."""
        self.scheduler = scheduler
        for stream in self.layers.values():
            stream.attach(scheduler)

    def predictions(self) -> dict[int, tuple[int, list[int]]]:
        """Layer -> (step, experts): the latest prediction made for each layer."""
        return {i: s.plan for i, s in self.layers.items() if s.plan is not None}

    # --- request and step boundaries ----------------------------------------------------
    def begin_request(self, request: int) -> None:
        self.request, self.pos = request, -1
        self.records.clear()  # only the running request's steps are kept (stats, benches)
        for stream in self.layers.values():
            stream.reset()
        if self.scheduler is not None:
            self.scheduler.begin_request(request)

    def end_request(self) -> None:
        """After the request's last step: cancel its prefetches still queued."""
        if self.scheduler is not None:
            self.scheduler.end_request()

    def begin_step(
        self, prefill: bool, prefetch: bool = True, executor: MoEExecutor | None = None
    ) -> None:
        """Step `self.step + 1` begins; `prefetch`: its predictions are for a step that runs
        and uses them (not a prompt step before the last one, nor the request's last step);
        `executor`: how it runs the streaming blocks (a prompt chunk, a batch; else one token)."""
        self.step += 1
        self.pos += 1
        self.prefill = prefill
        self.prefetching = prefetch
        self.executor = self.token if executor is None else executor
        self.cur = StepRecord(self.step, prefill)
        if self.scheduler is not None:
            self.scheduler.begin_step(self.step)
        if self.watch is not None:
            self.watch.begin()

    def substep(self) -> None:
        """The next sub-step of a prompt chunk (every graph so far is evaluated)."""
        self.step += 1
        if self.scheduler is not None:
            self.scheduler.begin_step(self.step)

    # --- the order of reads (the scheduler's, for the layers) ----------------------------
    def demand_first(self) -> AbstractContextManager[None]:
        """Prefetches issued inside are read after the demand reads issued inside."""
        return self.scheduler.demand_first() if self.scheduler is not None else nullcontext()

    def batched(self) -> AbstractContextManager[None]:
        """Prefetches issued inside reach the readers together."""
        return self.scheduler.batched() if self.scheduler is not None else nullcontext()

    @contextlib.contextmanager
    def evaluated(self, layer: int | None) -> Iterator[None]:
        """Every graph of this step before `layer` ran (its slots may be reused); the slot
        work inside (that fence move, prefetches) is applied by the planner thread."""
        sched = self.scheduler
        if sched is None:
            yield
            return
        with sched.deferred():
            if layer is not None:
                sched.evaluated(self.step, layer)
            yield

    def forget_failures(self) -> None:
        """Failed reads are forgotten (a batch ended the requests that needed them)."""
        if self.scheduler is not None:
            self.scheduler.forget_failures()

    def fence(self, out: mx.array) -> None:
        """Evaluate `out` and everything deferred: every graph of the step has run after it."""
        if self.groups is not None and self.groups.busy:
            self.groups.flush([out])
            return
        t0, c0 = time.perf_counter(), time.thread_time()
        mx.eval(out)
        self.span("eval", -1, t0, time.perf_counter(), time.thread_time() - c0)
        self.cur.syncs += 1

    def end_step(self, wall: float) -> None:
        self.cur.wall = wall
        self.records.append(self.cur)
        width, sched = self.width, self.scheduler
        if width is not None and width.auto and sched is not None and not self.cur.prefill:
            st = sched.stats  # (read without the lock: counters, a step's staleness is fine)
            width.step(self.step, self.cur.wait, wall, st.demand, st.read_busy_s, st.issued)
        if self.watch is not None:
            self.watch.end()

    def span(self, kind: str, layer: int, start: float, end: float, cpu: float = 0.0) -> None:
        """Account a compute-thread span; `cpu` is its thread CPU time (eval and wait)."""
        self.cur.cpu_excluded += cpu
        if kind in ("eval", "partial"):  # partial: a layer's staged experts launched early
            self.cur.eval += end - start
        elif kind == "predict":
            self.cur.predict += end - start
            self.cur.eval += end - start
        elif kind == "wait":
            self.cur.wait += end - start
        self.tracer.compute(kind, self.step, layer, start, end)
