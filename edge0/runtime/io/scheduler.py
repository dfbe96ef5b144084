"""The scheduler: a slot table, a fetcher and a planner composed; compute's slots, prefetches and
step boundaries (docs/runtime.md, "The I/O room")."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, Literal, overload

import attrs

from edge0.runtime.io import route_reads
from edge0.runtime.io.fetcher import Fetcher
from edge0.runtime.io.planner import Planner
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.slots import SlotPool, SlotState
from edge0.runtime.io.source import Arrivals, FenceNeeded
from edge0.runtime.io.staging import Staging
from edge0.runtime.io.table import SlotTable
from edge0.runtime.io.tickets import DEMAND, PREFETCH, FetchTicket, ReadStats
from edge0.runtime.io.trace import Tracer
from edge0.storage.tier import Tier

__all__ = ["FenceNeeded", "ReadStats", "Scheduler", "build_scheduler"]


class Scheduler:
    """Hands compute its slots and stages its predictions: `slots` says where experts are,
    `fetcher` reads them, `planner` orders the reads and applies deferred work."""

    def __init__(self, slots: SlotTable, fetcher: Fetcher, planner: Planner) -> None:
        self.slots = slots
        self.fetcher = fetcher
        self.planner = planner
        self.table: SlotPool = slots.pool  # (the pool itself: read by tests and the live view)
        self.memory: SlotMemory = slots.memory
        self.stats: ReadStats = fetcher.stats
        self.now = 0  # the step being computed
        self.request = 0
        self._lock = slots.lock
        self._loader = fetcher.tickets  # (layer, slot) -> last ticket
        self.order = self.table.order
        self.staging = Staging(self.table)
        self._claims = self.staging.claims  # (read by tests)

    # --- engine side ----------------------------------------------------------------------
    async def start(self, threads: bool = True) -> None:
        """Start the planner thread and the reads (see `Fetcher.start`)."""
        self.planner.start()
        await self.fetcher.start(threads)

    async def aclose(self) -> None:
        """Stop the workers; wake a compute thread still waiting for a read (it raises)."""
        await asyncio.to_thread(self.planner.stop)
        await self.fetcher.stop()
        self.fetcher.close()

    def counters(self) -> ReadStats:
        """A snapshot of the counters, deferred work applied first (any thread; brief lock)."""
        with self._lock:
            self.planner.drain()
            return attrs.evolve(self.stats, by_tier=dict(self.stats.by_tier))

    def io_time(self, since: float, until: float) -> float:
        """Wall time in [since, until] with at least one read in flight (union of reads)."""
        return self.fetcher.io_time(since, until)

    # --- request and step boundaries (the step clock) --------------------------------------
    def begin_request(self, request: int) -> None:
        """A new request. After failed reads, the reads still queued are cancelled and those
        in flight are waited for first, so that none of them fails a slot after the failures
        were forgotten (a failed request leaves the engine serving the next one)."""
        slots, fetcher = self.slots, self.fetcher
        with slots.cond:
            self.planner.drain()
            if slots.errors:  # (only then: in a batch the other requests' reads go on)
                for t in self._loader.values():
                    if t.outcome == "queued":
                        fetcher.cancel(t)
                while fetcher.in_flight and not slots.closed:
                    slots.cond.wait()
            self.request = request
            slots.forget_failures()
            self.staging.clear()
            fetcher.forget_spans()

    def end_request(self) -> int:
        """The request ended: its prefetches still queued are cancelled, never read."""
        n = 0
        with self._lock:
            self.planner.drain()
            for t in self._loader.values():
                if t.outcome == "queued" and t.kind == PREFETCH and t.step > self.now:
                    self.fetcher.cancel(t)
                    n += 1
        return n

    def forget_failures(self) -> None:
        """Failed reads are forgotten (a batch ended the requests that needed them)."""
        with self._lock:
            self.planner.drain()
            self.slots.forget_failures()

    def begin_step(self, step: int) -> None:
        """Compute starts `step`: every graph of earlier steps has been evaluated (the fence)."""
        with self._lock:
            self.now = step
            self.staging.claims.clear()
            self.planner.soon(self._past, step)

    def _past(self, step: int) -> list[FetchTicket]:
        """Step `step` began (lock held): earlier steps' graphs ran, their predictions expire."""
        self.table.advance(step - 1)
        self.staging.expire(step)
        return []

    def evaluated(self, step: int, layer: int) -> None:
        """Compute evaluated every graph of `step` before `layer` (their slots may be reused)."""
        if self.planner.defer(self._advance, (step, layer)):  # inside `deferred()`
            return
        with self._lock:  # (nobody waits for this: compute itself is the only waiter)
            self.planner.drain()
            self._advance(step, layer)

    def _advance(self, step: int, layer: int) -> list[FetchTicket]:
        order = self.order.get(layer)
        if order is not None:
            self.table.advance(step, order - 1)
        return []

    def batched(self) -> AbstractContextManager[None]:
        """Prefetches issued inside reach the tier workers together (`Planner.batched`)."""
        return self.planner.batched()

    def demand_first(self) -> AbstractContextManager[None]:
        """Prefetches issued inside are read after its demand reads (`Planner.demand_first`)."""
        return self.planner.demand_first()

    def deferred(self) -> AbstractContextManager[None]:
        """Prefetches and fence moves inside go to the planner thread (`Planner.deferred`)."""
        return self.planner.deferred()

    # --- compute side -----------------------------------------------------------------------
    @overload
    def acquire(
        self, layer: int, step: int, experts: list[int], fenced: bool = True
    ) -> list[int]: ...
    @overload
    def acquire(
        self, layer: int, step: int, experts: list[int], *, arrivals: Literal[True]
    ) -> Arrivals: ...
    @overload
    def acquire(self, layer: int, step: int, experts: list[int], *, within: float) -> set[int]: ...
    @overload
    def acquire(
        self, layer: int, step: int, experts: list[int], *, servable: Literal[True]
    ) -> set[int]: ...
    def acquire(
        self,
        layer: int,
        step: int,
        experts: list[int],
        fenced: bool = True,
        *,
        arrivals: bool = False,
        within: float | None = None,
        servable: bool = False,
    ) -> list[int] | Arrivals | set[int]:
        """Slots holding `experts` of `layer`, ready for `step`; blocks until they are.

        `fenced`: compute evaluated the graph that produced this layer's input, so every
        earlier layer of `step` is done with its slots (they may be rewritten). Without
        it (route mode's deferred syncs) the fence stays where `evaluated` put it, and a
        full pool raises `FenceNeeded` so compute can evaluate and ask again.
        `arrivals`, `within` and `servable`: see `ExpertSource.acquire`.
        """
        if arrivals:
            got, done = self._start(layer, step, experts, True)
            return Arrivals(got, done, partial(self.arrived, layer, step, experts, got))
        if within is not None:
            parts = self.slots, self.fetcher, self.planner
            return route_reads.within(*parts, self.request, layer, step, experts, within)
        if servable:
            return route_reads.servable(self.slots, self.fetcher, self.planner, layer, experts)
        got, done = self._start(layer, step, experts, fenced)
        if done:
            return got
        table, slots = self.table, self.slots
        with slots.cond:
            while any(table.state(s) is SlotState.LOADING for s in got):
                slots.wait()
            for s, e in zip(got, experts, strict=True):
                slots.check(layer, s, e)
            self._consume(layer, got, experts, step)
        return got

    def arrived(
        self, layer: int, step: int, experts: list[int], slots: list[int], pending: list[int]
    ) -> list[int]:
        """The positions in `pending` (indices into `experts` and their `slots`, from
        `acquire`) whose reads are done, once at least one is (blocks); compute reads them
        now. A failed read raises its error."""
        table, st = self.table, self.slots
        with st.cond:
            while True:
                done = [i for i in pending if table.state(slots[i]) is not SlotState.LOADING]
                if done:
                    break
                st.wait()
            for i in done:
                st.check(layer, slots[i], experts[i])
            self._consume(layer, [slots[i] for i in done], [experts[i] for i in done], step)
        return done

    def _start(
        self, layer: int, step: int, experts: list[int], fenced: bool
    ) -> tuple[list[int], bool]:
        """`acquire` without its wait: the slots of `experts`, reads issued at once for those
        not staged, and whether every one is ready and consumed already (else `arrived`
        tells which are, as their reads complete). Blocks only for a free slot."""
        table, planner = self.table, self.planner
        with self.slots.cond:
            if (layer, step) in planner.queued:  # its prefetch is not applied yet: apply it
                planner.drain()
            if fenced:
                table.advance(step, table.order[layer] - 1)
            claimed = self.staging.claimed(layer, step, experts)
            if claimed is not None:
                self.stats.staged_hits += len(experts)
                planner.soon(self._consume, layer, claimed, experts, step)
                return claimed, True
            planner.drain()  # the slow path: every deferred fence move and reservation first
            for s in self.staging.unneeded(layer, step, experts):  # cancel their queued reads
                t = self._loader.get((layer, s))
                if t is not None and t.outcome == "queued":
                    self.fetcher.cancel(t)
            staged = table.claim(layer, experts, step)
            if staged is not None:  # every expert staged and ready: no ticket, no wait
                self.stats.staged_hits += len(experts)
                planner.soon(self._consume, layer, staged, experts, step)
                return staged, True
            return self._demand(layer, step, experts, fenced), False

    def _demand(self, layer: int, step: int, experts: list[int], fenced: bool) -> list[int]:
        """Demand reads of `experts` not staged (lock held); blocks only for a free slot."""
        table, planner, issue = self.table, self.planner, self.fetcher.issue
        slots: list[int] = []
        new: list[FetchTicket] = []
        for e in experts:
            got = issue(self.request, layer, step, e, DEMAND)
            while got is None:  # no free slot: take back a later prefetch, or wait for one
                if table.steal(step, layer) is None:
                    if not table.any_loading():
                        planner.submit(new)
                        if not fenced:  # slots wait on unevaluated graphs: evaluate first
                            self.stats.fences += 1
                            raise FenceNeeded(layer)
                        raise RuntimeError(f"slot pool is over capacity at layer {layer}")
                    planner.submit(new)
                    new = []
                    planner.post_after()  # (a held prefetch may be what frees a slot)
                    self.slots.wait()
                got = issue(self.request, layer, step, e, DEMAND)
            slots.append(got[0])
            if got[1] is not None:
                new.append(got[1])
        planner.submit(new)
        self.stats.staged_misses += len(new)
        self.stats.staged_hits += len(experts) - len(new)
        return slots

    def _consume(self, layer: int, slots: list[int], experts: list[int], step: int) -> list[Any]:
        """Compute reads these slots at `step`: the tickets that filled them were used (lock
        held; later tickets into the same slots are not these)."""
        loader = self._loader
        for s, e in zip(slots, experts, strict=True):
            t = loader.get((layer, s))
            if t is not None and not t.consumed and t.expert == e and t.step <= step:
                t.consumed = True
                self.stats.consumed += 1
        return []

    @overload
    def prefetch(
        self,
        layer: int,
        step: int,
        experts: list[int],
        *,
        unless_servable: bool = False,
        keep: bool = False,
    ) -> int: ...
    @overload
    def prefetch(
        self, layer: int, step: int, experts: list[int], *, staged: Literal[True]
    ) -> list[int]: ...
    def prefetch(
        self,
        layer: int,
        step: int,
        experts: list[int],
        *,
        unless_servable: bool = False,
        keep: bool = False,
        staged: bool = False,
    ) -> int | list[int]:
        """Stage `experts` of `layer` for `step` (one ahead); returns how many reads were issued
        (0 inside `deferred()`: the planner issues them). `unless_servable`, `keep` and
        `staged`: see `ExpertSource.prefetch`."""
        if unless_servable:
            have = route_reads.servable(self.slots, self.fetcher, self.planner, layer, experts)
            misses = [e for e in experts if e not in have]
            return self.prefetch(layer, step, misses) if misses else 0
        if keep:
            return route_reads.keep(self.slots, self.fetcher, self.planner, layer, step, experts)
        if staged:
            ready = route_reads.staged(self.slots, self.planner, layer, set(experts))
            if ready:
                self.prefetch(layer, step, ready)  # all held: reservations, no tickets
            return ready
        return self._prefetch(layer, step, experts)

    def _prefetch(self, layer: int, step: int, experts: list[int]) -> int:
        planner = self.planner
        if planner.defer(self._stage, (layer, step, experts), key=(layer, step)):
            return 0
        with self._lock:
            planner.drain()
            new = self._stage(layer, step, experts)
            planner.submit_prefetch(new)
        return len(new)

    def _stage(self, layer: int, step: int, experts: list[int]) -> list[FetchTicket]:
        """Reserve slots for `experts` of `layer` at `step` (lock held); the new tickets."""
        self.staging.add(layer, step, experts)
        new = []
        issue, request = self.fetcher.issue, self.request
        for e in experts:
            got = issue(request, layer, step, e, PREFETCH)
            if got is not None and got[1] is not None:
                new.append(got[1])
        return new

    # --- route policies ---------------------------------------------------------------------


def build_scheduler(
    tier: Tier, memory: SlotMemory, pool: SlotPool, tracer: Tracer, workers: int = 2
) -> Scheduler:
    """A scheduler over `pool` and `memory`, reading from `tier` with `workers` readers."""
    table = SlotTable(pool, memory)
    fetcher = Fetcher(table, tier, tracer, workers)
    return Scheduler(table, fetcher, Planner(table.lock, fetcher.post))
