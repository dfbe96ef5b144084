"""The issue side of the scheduler: slot reservations and fetch tickets, at once or deferred to the
planner thread (docs/runtime.md, "Threads").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from edge0.runtime.io.planner import Op, Planner
from edge0.runtime.io.readers import ReaderThreads
from edge0.runtime.io.slots import SlotPool
from edge0.runtime.io.tickets import DEMAND, PREFETCH, FetchTicket, ReadStats, TicketQueue


class Issuer:
    """Reservations and tickets for compute's requests; prefetches deferred to the planner."""

    # set by Fetcher.__init__ and Fetcher.start
    _lock: threading.Lock
    table: SlotPool
    order: dict[int, int]
    stats: ReadStats
    request: int
    _loader: dict[tuple[int, int], FetchTicket]
    _loop: asyncio.AbstractEventLoop | None
    _queue: TicketQueue | None
    _readers: ReaderThreads | None
    _held: list[FetchTicket] | None
    _planner: Planner | None
    _deferring: list[Op] | None
    _queued: collections.Counter[tuple[int, int]]
    _ahead: dict[tuple[int, int], set[int]]
    _planned: dict[tuple[int, int], list[int]]
    _after: list[FetchTicket] | None

    def _enqueue(self, tickets: list[FetchTicket]) -> None:
        assert self._queue is not None
        for t in tickets:
            self._queue.put(t)

    def _issue(
        self, layer: int, step: int, expert: int, kind: str
    ) -> tuple[int, FetchTicket | None] | None:
        res = self.table.reserve(layer, expert, step)
        if res is None:
            return None
        if not res.needs_read:
            return res.slot, None
        t = FetchTicket(self.request, step, layer, expert, res.slot, kind, self.order[layer])
        self._loader[(layer, res.slot)] = t
        self.stats.issued += 1
        if kind == DEMAND:
            self.stats.demand += 1
        else:
            self.stats.prefetch += 1
        return res.slot, t

    def _submit(self, tickets: list[FetchTicket]) -> None:
        if self._held is not None:  # inside `batched()`: one wake-up at its end
            self._held.extend(tickets)
            return
        self._post(tickets)

    def _post(self, tickets: list[FetchTicket]) -> None:
        """Hand `tickets` to the readers (or the loop's tier workers) now."""
        if not tickets:
            return
        if self._readers is not None:
            self._readers.put(tickets)
            return
        assert self._loop is not None, "Scheduler.start() was not awaited"
        self._loop.call_soon_threadsafe(self._enqueue, tickets)

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Prefetches issued inside reach the tier workers together: one event-loop wake-up."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            self._submit(held)

    @contextlib.contextmanager
    def demand_first(self) -> Iterator[None]:
        """Prefetch tickets issued inside reach the readers after the demand reads issued
        inside (at its end, or before compute waits): slots are reserved in the order asked,
        but a reader idle meanwhile never takes a next-step read ahead of this step's."""
        self._after = []
        try:
            yield
        finally:
            self._post_after()

    def _post_after(self) -> None:
        held, self._after = self._after, None
        if held:
            self._submit(held)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Prefetches and fence moves issued inside are applied by the planner thread
        (edge0.runtime.io.planner), in order, before anything else reads the slot table."""
        if self._planner is None:  # not started: at once, one wake-up for the tickets
            with self.batched():
                yield
            return
        ops: list[Op] = []
        self._deferring = ops
        try:
            yield
        finally:
            self._deferring = None
            with self._lock:  # counted with the lock, which the ops' applier holds
                for fn, args in ops:
                    if fn == self._stage_queued:
                        self._queued[args[:2]] += 1
            self._planner.put(ops)

    def _drain(self) -> None:
        """Apply the deferred work still queued (the lock is held): the slot table is current."""
        if self._planner is not None:
            self._planner.drain()

    def _soon(self, fn: Callable[..., list[FetchTicket]], *args: Any) -> None:
        """Run `fn(*args)` on the planner thread at its next wake-up (at once when there is
        none; the lock is held): bookkeeping that nothing on the compute thread waits for."""
        if self._planner is None:
            self._post(fn(*args))
        else:
            self._planner.put([(fn, args)], wake=False)

    def prefetch(self, layer: int, step: int, experts: list[int]) -> int:
        """Stage `experts` of `layer` for `step` (one ahead); returns how many reads were issued
        (0 inside `deferred()`: the planner issues them)."""
        if self._deferring is not None:
            self._deferring.append((self._stage_queued, (layer, step, experts)))
            return 0
        with self._lock:
            self._drain()
            new = self._stage(layer, step, experts)
            if self._after is not None:  # inside `demand_first()`
                self._after.extend(new)
            else:
                self._submit(new)
        return len(new)

    def _stage_queued(self, layer: int, step: int, experts: list[int]) -> list[FetchTicket]:
        """A deferred prefetch applied (lock held): no longer queued."""
        left = self._queued[(layer, step)] - 1
        if left > 0:
            self._queued[(layer, step)] = left
        else:
            del self._queued[(layer, step)]
        return self._stage(layer, step, experts)

    def _stage(self, layer: int, step: int, experts: list[int]) -> list[FetchTicket]:
        """Reserve slots for `experts` of `layer` at `step` (lock held); the new tickets."""
        ahead = self._ahead.get((layer, step))
        if ahead is None:
            self._ahead[(layer, step)] = set(experts)
            self._planned[(layer, step)] = experts  # what the step claim checks
        else:
            ahead.update(experts)
            self._planned.pop((layer, step), None)  # a union: acquire alone decides
        new = []
        for e in experts:
            got = self._issue(layer, step, e, PREFETCH)
            if got is not None and got[1] is not None:
                new.append(got[1])
        return new
