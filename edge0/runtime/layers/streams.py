"""One collaborator per streamed layer: its planned set, its routing sync and prefetch, its slots
(docs/runtime.md, "One decode step, one streamed layer").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import mlx.core as mx

from edge0.routing.predictors import HostSets, Predictor
from edge0.runtime.io.source import Arrivals, ExpertSource, FenceNeeded
from edge0.runtime.layers.clock import Clock, MoEExecutor
from edge0.runtime.layers.policy import RoutePolicy
from edge0.runtime.layers.syncs import Deferred, Issuing
from edge0.runtime.layers.width import Width


class StreamClock(Clock, Protocol):
    """The step clock as a stream and its block read it: also the route policy, and how the
    step under way runs a block (edge0.runtime.compute.steps.Steps)."""

    @property
    def policy(self) -> RoutePolicy | None: ...

    @property
    def executor(self) -> MoEExecutor: ...

    def demand_first(self) -> AbstractContextManager[None]: ...


class Experts(Protocol):
    """Where a layer's expert weights are, and how compute indexes them."""

    views: dict[str, mx.array]  # field -> stacked (n, ...) weights, scales, biases

    def index(self, experts: list[int], inds: mx.array) -> mx.array: ...


class ResidentExperts:
    """All experts of the layer in memory (first-layer policy "resident"): they index themselves."""

    def __init__(self, views: dict[str, mx.array]) -> None:
        self.views = views

    def index(self, experts: list[int], inds: mx.array) -> mx.array:
        return inds


class SlotExperts:
    """The layer's slot table: `index` blocks until the experts are staged, returns their slots."""

    def __init__(self, layer: int, views: dict[str, mx.array], steps: StreamClock) -> None:
        self.layer = layer
        self.views = views
        self.steps = steps
        self.scheduler: ExpertSource | None = None  # attached once the tier stack is open

    def index(self, experts: list[int], inds: mx.array) -> mx.array:
        return mx.array([[self.acquire(experts)]], dtype=mx.uint32)  # (1, 1, K) slot indices

    def acquire(self, experts: list[int]) -> list[int]:
        """The slots of `experts` for this step, once staged (blocks on their reads)."""
        assert self.scheduler is not None, "Steps.attach(scheduler) was not called"
        steps = self.steps
        t0 = time.perf_counter()
        groups = steps.groups
        fenced = groups is None or not groups.busy  # else earlier layers' graphs may be pending
        try:
            slots = self.scheduler.acquire(self.layer, steps.step, experts, fenced)
        except FenceNeeded:
            assert groups is not None
            groups.flush([])  # evaluates up to this layer's input: earlier slots are free
            slots = self.scheduler.acquire(self.layer, steps.step, experts)
        # wall time only: blocked on reads costs no CPU, the slot bookkeeping is overhead
        steps.span("wait", self.layer, t0, time.perf_counter())
        return slots

    def arrivals(self, experts: list[int]) -> Iterator[list[tuple[int, int]]]:
        """The slots of `experts` in at most two groups of (position in `experts`, slot): those
        ready now (the staged ones; else the first read to land), then the rest once their
        reads have all landed (one group per read cost more on the compute thread than it
        saved: docs/benchmarks/budget.md). The missing reads are issued now; the groups
        block between them."""
        assert self.scheduler is not None, "Steps.attach(scheduler) was not called"
        t0 = time.perf_counter()
        staged = self.scheduler.acquire(self.layer, self.steps.step, experts, arrivals=True)
        return self._groups(experts, staged, t0)

    def _groups(
        self, experts: list[int], staged: Arrivals, t0: float
    ) -> Iterator[list[tuple[int, int]]]:
        steps, slots, done = self.steps, staged.slots, staged.done
        pending = list(range(len(experts)))
        first = True
        while pending:
            got: list[int] = []
            while pending and (not got or not first):  # after the first group: all the rest
                if done:
                    more = pending
                else:
                    more = staged.arrived(pending)
                got += more
                pending = [i for i in pending if i not in more]
            first = False
            steps.span("wait", self.layer, t0, time.perf_counter())
            yield [(i, slots[i]) for i in got]
            t0 = time.perf_counter()


class Lookahead:
    """The prediction one layer owns: its target layer's experts at the next step, prefetched."""

    def __init__(
        self, layer: int, predictor: Predictor, target: LayerStream, steps: StreamClock
    ) -> None:
        self.layer = layer
        self.predictor = predictor
        self.target = target
        self.steps = steps
        self.scheduler: ExpertSource | None = None  # attached once the tier stack is open
        self.on_host: bool | None = None  # the predictor decides on the host (known once run)
        self.width: Width | None = None  # hint: how many predicted experts are prefetched

    def graph(
        self,
        x: mx.array,
        inds: mx.array,
        prev: mx.array | None,
        k: int,
        ranked: bool = False,
        sets: HostSets = None,
    ) -> mx.array | None:
        """The lazy (k,) prediction, evaluated with the layer's routing (None: host predictor);
        `ranked`: best first; `sets`: the host lists of `inds` and `prev`, when known."""
        got = self.predictor.graph(self.layer, x, inds, prev, k, ranked, sets=sets)
        self.on_host = got is None
        return got

    def wanted(self) -> bool:
        """Whether this step predicts at all (a prefetch width of 0 predicts only to score)."""
        return self.width is None or self.width.ask(self.steps.step)[0] > 0

    def step_graph(
        self, x: mx.array, inds: mx.array, prev: mx.array | None, k: int, sets: HostSets = None
    ) -> mx.array | None:
        """A one-token step's prediction: K experts, or the prefetch width's ask (the `now`
        best, or on a scored step every rank, best first)."""
        width = self.width
        if width is None:
            return self.graph(x, inds, prev, k, sets=sets)
        return self.graph(x, inds, prev, *width.ask(self.steps.step), sets=sets)

    def issue(
        self,
        x: mx.array,
        experts: list[int],
        true: list[int],
        prev: list[int] | None,
        graph: mx.array | None,
        k: int,
    ) -> None:
        """Hand the prediction to the target layer and prefetch it for the next step."""
        steps, width = self.steps, self.width
        got: list[int] | None
        if graph is not None:
            got = graph.tolist()  # type: ignore[assignment]
        else:
            t0 = time.perf_counter()
            ask = k if width is None else width.ask(steps.step)[0]
            got = self.predictor.predict(self.layer, steps.pos, x, experts, true, prev, ask)
            steps.span("predict", self.layer, t0, time.perf_counter())
        if got is None:
            return
        if width is not None and width.scoring(steps.step):  # the best `now` are read
            self.target.ranked[(steps.step + 1) & 1] = (steps.step + 1, got)
            got = got[: width.now]
            if not got:
                return
        self.target.offer(steps.step + 1, got)
        assert self.scheduler is not None, "Steps.attach(scheduler) was not called"
        self.scheduler.prefetch(self.target.layer, steps.step + 1, got)


class LayerStream:
    """A streamed layer whose routing is the true router's (reactive, hint)."""

    def __init__(
        self, layer: int, steps: StreamClock, experts: Experts, quant: dict[str, Any]
    ) -> None:
        self.layer = layer
        self.steps = steps
        self.experts = experts
        self.quant = quant
        self.top_k = steps.top_k
        self.host_experts = not isinstance(experts, ResidentExperts)  # slots need the set on host
        self.overlap = False  # --overlap: staged experts computed while the missing are read
        self.head: Lookahead | None = None  # the prediction this layer owns, if any
        # (step, experts) predicted for this layer, by step parity: an owner that runs earlier
        # in the step predicts step t+1 before this layer has used its plan for step t
        self.plans: list[tuple[int, list[int]] | None] = [None, None]
        # (step, experts best first) ranked for this layer under an auto prefetch width: the
        # width scores each rank against this layer's true top-K at that step
        self.ranked: list[tuple[int, list[int]] | None] = [None, None]
        self.width: Width | None = None  # the engine's prefetch width (hint; scores ranks)
        self.prev_experts: list[int] | None = None  # executed at the previous step
        self.prev_inds: mx.array | None = None
        # the owned prediction's prefetch, held until this layer's own reads are issued
        self._held: tuple[Issuing, tuple[Any, ...]] | None = None
        # (array, the host list it was made from) for this step's routing and for `prev_inds`:
        # a head reads those sets as host lists (held by identity: an array set elsewhere,
        # a batch row's or a prompt chunk's, has no list here and takes the graph's way)
        self._host: tuple[mx.array, list[int]] | None = None
        self._host_prev: tuple[mx.array, list[int]] | None = None

    def attach(self, scheduler: ExpertSource) -> None:
        """The scheduler, once the tier stack is open: for slot acquisition and prefetch."""
        if isinstance(self.experts, SlotExperts):
            self.experts.scheduler = scheduler
        if self.head is not None:
            self.head.scheduler = scheduler

    def reset(self) -> None:
        """A new request: nothing predicted, no previous step."""
        self.plans = [None, None]
        self.ranked = [None, None]
        self.prev_experts = self.prev_inds = None
        self._held = None
        self._host = self._host_prev = None

    def offer(self, step: int, experts: list[int]) -> None:
        """The owner's prediction of this layer's experts at `step`."""
        self.plans[step & 1] = (step, experts)

    def acquire(self, experts: list[int]) -> list[int]:
        """The slots of `experts` (a streamed layer) for this step, once staged."""
        assert isinstance(self.experts, SlotExperts), f"layer {self.layer} has no slots"
        return self.experts.acquire(experts)

    @property
    def plan(self) -> tuple[int, list[int]] | None:
        """The latest prediction made for this layer."""
        made = [p for p in self.plans if p is not None]
        return max(made, key=lambda p: p[0]) if made else None

    def planned(self) -> list[int] | None:
        """The expert set predicted for this step when it is the routing (only `RoutedStream`)."""
        return None

    def choose(
        self, x: mx.array, scores: mx.array, true_inds: mx.array, planned: list[int]
    ) -> tuple[list[int], bool]:
        """Route mode: the set this layer runs (the route policy's choice, else the
        prediction) and whether it is the true top-K in the router's order."""
        policy = self.steps.policy
        if policy is None:
            return planned, False
        return policy.choose(self, x, scores, true_inds, planned)

    def needs_true(self) -> bool:
        """Whether this step reads the true router's top-K (the block builds it only then)."""
        return True

    def made(self, inds: mx.array, experts: list[int]) -> None:
        """This step's routing `inds` (1, 1, K) was made from the host list `experts`."""
        self._host = (inds, experts)

    def host_sets(self, inds: mx.array) -> HostSets:
        """The host lists of `inds` and `prev_inds` (None where one is not known), and
        `inds` becomes the previous step's for the next one."""
        cur, prev, self._host = self._host, self._host_prev, None
        known = cur is not None and cur[0] is inds
        self._host_prev = cur if known else None
        if not known:
            return None
        assert cur is not None
        if self.prev_inds is None:
            return (cur[1], None)
        if prev is not None and prev[0] is self.prev_inds:
            return (cur[1], prev[1])
        return None

    def route(
        self,
        x: mx.array,
        true_inds: mx.array | None,
        inds: mx.array,
        w: mx.array | None,
        planned: list[int] | None,
        hold: bool = False,
    ) -> list[int]:
        """One eval of the routing and the owned prediction; prefetch (`hold`: held for
        `arrivals`, which the caller calls next); return the experts to run."""
        steps = self.steps
        head = self.head if steps.prefetching else None
        if head is not None and not head.wanted():
            head = None
        sets = self.host_sets(inds)
        pred = None
        if head is not None:
            pred = head.step_graph(x, inds, self.prev_inds, self.top_k, sets)
        t0, c0 = time.perf_counter(), time.thread_time()
        mx.eval([a for a in (true_inds, w, pred) if a is not None])  # one eval per layer
        steps.span("eval", self.layer, t0, time.perf_counter(), time.thread_time() - c0)
        steps.cur.syncs += 1
        steps.cur.layers += 1
        self.prev_inds = inds
        work = Deferred(self, x, true_inds, pred, planned, self.prev_experts, head)
        self.finish(work, hold=hold and self.overlaps())
        assert self.prev_experts is not None
        return self.prev_experts

    def finish(self, work: Deferred, hold: bool = False) -> None:
        """After the readback: record the routing, hand the owned prediction on (prefetch;
        `hold`: by `arrivals`, whose own reads go first)."""
        steps = self.steps
        true: list[int] | None = None
        if work.true_inds is not None:
            true = work.true_inds.tolist()[0][0]  # type: ignore[index,assignment]  # (1, 1, K)
        experts = work.experts if work.experts is not None else true
        if work.chosen is not None:  # the in-graph route policy's choice was the routing
            experts = work.chosen.reshape(-1).tolist()  # type: ignore[assignment]
        assert experts is not None
        if steps.recording is not None and true is not None:
            steps.recording[(steps.pos, self.layer)] = list(true)
        ranked = self.ranked[steps.step & 1]
        if ranked is not None and ranked[0] == steps.step and true is not None:
            assert self.width is not None
            self.width.observe(ranked[1], true)
        if (
            true is not None
            and work.experts is not None
            and (steps.policy is None or work.chosen is not None)
        ):
            steps.count_recall(experts, true)  # the prediction (or the choice) was the routing
        self.prev_experts = experts
        self._held = None
        if work.head is not None:
            args = (work.x, experts, true or experts, work.prev, work.pred, self.top_k)
            if hold:
                self._held = (work.head, args)
            else:
                work.head.issue(*args)

    def slots(self, experts: list[int], inds: mx.array) -> mx.array:
        """Indices into `views` of `experts` (blocks until a streamed layer's slots are staged)."""
        return self.experts.index(experts, inds)

    def overlaps(self) -> bool:
        """Whether the block takes this layer's slots through `arrivals` (a streamed layer
        synced on its own, under --overlap: the staged experts computed while the missing
        ones are read)."""
        return self.overlap and isinstance(self.experts, SlotExperts) and self.steps.groups is None

    def arrivals(self, experts: list[int]) -> Iterator[list[tuple[int, int]]] | None:
        """The slots of `experts` (the set `route` returned) in groups as their reads
        complete; the owned prediction's prefetch (`route` held it) is read after the
        missing ones. None where `overlaps` says no: take `slots` in one piece."""
        if not self.overlaps():
            return None
        assert isinstance(self.experts, SlotExperts)
        held, self._held = self._held, None
        with self.steps.demand_first():  # slots reserved as before, read after
            if held is not None:
                held[0].issue(*held[1])
            return self.experts.arrivals(experts)

    @property
    def views(self) -> dict[str, mx.array]:
        return self.experts.views


class RoutedStream(LayerStream):
    """A layer in route mode: in decode steps the set predicted one step ago is the routing.

    With `steps.groups` (--sync-every G > 1) a decode step's layer needs no readback:
    its prediction and recorded routing are evaluated with its group of G layers.
    """

    def planned(self) -> list[int] | None:
        steps = self.steps
        plan = self.plans[steps.step & 1]
        if steps.prefill or plan is None or plan[0] != steps.step:
            return None
        steps.routed_by_prediction += 1
        return plan[1]

    def needs_true(self) -> bool:
        # a grouped decode step reads the true set back only to record it or for a host
        # predictor (not known before the head first ran: then read, to be safe)
        steps = self.steps
        if steps.groups is None or steps.prefill or steps.recording is not None or steps.policy:
            return True  # (a route policy ranks by the true set)
        return self.head is not None and steps.prefetching and self.head.on_host is not False

    def route(
        self,
        x: mx.array,
        true_inds: mx.array | None,
        inds: mx.array,
        w: mx.array | None,
        planned: list[int] | None,
        hold: bool = False,
    ) -> list[int]:
        steps, groups = self.steps, self.steps.groups
        if groups is None or steps.prefill or (planned is None and self.host_experts):
            if groups is not None and groups.busy:
                groups.flush([])
            return super().route(x, true_inds, inds, w, planned, hold)
        head = self.head if steps.prefetching else None
        sets = self.host_sets(inds)
        pred = None
        if head is not None:
            pred = head.graph(x, inds, self.prev_inds, self.top_k, sets=sets)
        chosen = inds if steps.policy is not None and steps.policy.on_device else None
        read_true = (
            planned is None
            or steps.recording is not None
            or chosen is not None
            or (head is not None and pred is None)
        )
        assert true_inds is not None or not read_true, "needs_true() said no true set"

        steps.cur.layers += 1
        self.prev_inds = inds
        groups.add(
            Deferred(
                self,
                x,
                true_inds if read_true else None,
                pred,
                planned,
                self.prev_experts,
                head,
                chosen,
            )
        )
        return planned if planned is not None else []  # [] only for resident experts (unused)
