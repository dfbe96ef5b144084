"""The fetcher: fetch tickets, read into their slots by reader threads or loop workers, and the
read counters (docs/runtime.md, "Threads")."""

from __future__ import annotations

import asyncio
import collections
import time

from edge0.errors import Edge0Error, TierReadError
from edge0.log import get_logger
from edge0.runtime.io.readers import ReaderThreads
from edge0.runtime.io.table import SlotTable
from edge0.runtime.io.tickets import DEMAND, FetchTicket, ReadStats, TicketQueue
from edge0.runtime.io.trace import Tracer
from edge0.storage.tier import BlockingRead, ExpertKey, ReadInfo, Tier, blocking_read

log = get_logger("edge0.runtime.io.scheduler")


class Fetcher:
    """Tickets for the slots `table` reserves, and their reads (reader threads, or tier
    workers on the loop) from `tier` into the table's memory."""

    def __init__(self, table: SlotTable, tier: Tier, tracer: Tracer, workers: int = 2) -> None:
        self.table = table
        self.tier = tier
        self.tracer = tracer
        self.n_workers = workers
        self.stats = ReadStats()
        self.tickets: dict[tuple[int, int], FetchTicket] = {}  # (layer, slot) -> last ticket
        self.layers_read: set[int] = set()  # layers with a ticket issued (ranks report them)
        self.in_flight = 0
        self._busy_since = 0.0
        self.intervals: collections.deque[tuple[float, float]] = collections.deque(maxlen=1 << 18)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: TicketQueue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._readers: ReaderThreads | None = None  # reads off the loop (a blocking stack)
        self._blocking: BlockingRead | None = None

    # --- tickets ------------------------------------------------------------------------
    def issue(
        self, request: int, layer: int, step: int, expert: int, kind: str
    ) -> tuple[int, FetchTicket | None] | None:
        """Reserve a slot for `expert` of `layer` at `step` (lock held): the slot, and the
        ticket to read it (None: already there); None when no slot is free."""
        res = self.table.pool.reserve(layer, expert, step)
        if res is None:
            return None
        if not res.needs_read:
            return res.slot, None
        order = self.table.pool.order[layer]
        t = FetchTicket(request, step, layer, expert, res.slot, kind, order)
        self.tickets[(layer, res.slot)] = t
        self.layers_read.add(layer)
        self.stats.issued += 1
        if kind == DEMAND:
            self.stats.demand += 1
        else:
            self.stats.prefetch += 1
        return res.slot, t

    def cancel(self, t: FetchTicket) -> None:
        """A queued ticket is never read (lock held): its slot is emptied."""
        t.outcome = "cancelled"
        self.table.pool.clear(t.slot)
        self.stats.cancelled += 1

    def post(self, tickets: list[FetchTicket]) -> None:
        """Hand `tickets` to the readers (or the loop's tier workers) now."""
        if not tickets:
            return
        if self._readers is not None:
            self._readers.put(tickets)
            return
        assert self._loop is not None, "Scheduler.start() was not awaited"
        self._loop.call_soon_threadsafe(self._enqueue, tickets)

    def _enqueue(self, tickets: list[FetchTicket]) -> None:
        assert self._queue is not None
        for t in tickets:
            self._queue.put(t)

    # --- event loop side ------------------------------------------------------------------
    async def start(self, threads: bool = True) -> None:
        """Start the reads: reader threads when the tier stack reads on any thread (and
        `threads`), else tier worker coroutines on this event loop."""
        self._loop = asyncio.get_running_loop()
        read = blocking_read(self.tier) if threads else None
        if read is not None:
            self._blocking = read
            self._readers = ReaderThreads(self.n_workers, self._read_here)
            return
        self._queue = TicketQueue()
        self._tasks = [
            asyncio.create_task(self._worker(i), name=f"edge0-tier-{i}")
            for i in range(self.n_workers)
        ]

    async def stop(self) -> None:
        """Stop the workers (the reads in flight finish first)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        if self._readers is not None:
            await asyncio.to_thread(self._readers.stop)

    def close(self) -> None:
        """Fail the reads left and wake a compute thread still waiting for one (it raises)."""
        table = self.table
        with table.cond:
            for t in self.tickets.values():
                if t.outcome in ("queued", "running"):
                    t.outcome = "cancelled"
                    table.pool.mark_failed(t.slot, t.layer, t.expert)
            table.close()

    # --- one read ---------------------------------------------------------------------------
    def _begin(self, t: FetchTicket, wid: int) -> bool:
        """A worker takes `t` (False: it was cancelled while queued)."""
        with self.table.lock:
            if t.outcome != "queued":
                return False
            t.outcome, t.worker, t.started = "running", wid, time.perf_counter()
            if self.in_flight == 0:
                self._busy_since = t.started
            self.in_flight += 1
            return True

    def _read_here(self, t: FetchTicket, wid: int) -> None:
        """One read on a reader thread, start to finish (the loop takes no part)."""
        if not self._begin(t, wid):
            return
        assert self._blocking is not None
        memory = self.table.memory
        info: ReadInfo | Exception
        try:
            info = self._blocking(ExpertKey(t.layer, t.expert), memory.dest(t.layer, t.slot))
            if memory.widened:  # scales/biases into the compute dtype
                memory.widen(t.slot)
        except Exception as exc:  # noqa: BLE001 - any tier failure fails this read only
            info = exc
        self._complete(t, info)

    def _complete(self, t: FetchTicket, info: ReadInfo | Exception) -> None:
        """A read's outcome (what the tier returned, or its failure) into the slot table."""
        if isinstance(info, Exception):
            self._finish(t, error=_read_error(t, info))
        else:
            t.tier, t.nbytes, t.hit = info.tier, info.nbytes, info.hit
            self._finish(t)
        self.tracer.read(t)

    async def _worker(self, wid: int) -> None:
        assert self._queue is not None
        memory = self.table.memory
        while True:
            t = await self._queue.get()
            if not self._begin(t, wid):
                continue  # cancelled while queued
            info: ReadInfo | Exception
            try:
                info = await self.tier.read_into(
                    ExpertKey(t.layer, t.expert), memory.dest(t.layer, t.slot)
                )
                if memory.widened:  # scales/biases into the compute dtype, off the loop
                    await asyncio.to_thread(memory.widen, t.slot)
            except asyncio.CancelledError:  # the engine is closing
                self._finish(
                    t, error=TierReadError("cancelled", layer=t.layer, expert=t.expert), quiet=True
                )
                raise
            except Exception as exc:  # noqa: BLE001 - any tier failure fails this read only
                info = exc
            self._complete(t, info)

    def _finish(
        self, t: FetchTicket, error: BaseException | None = None, quiet: bool = False
    ) -> None:
        table, stats = self.table, self.stats
        with table.cond:
            t.finished = time.perf_counter()
            self.in_flight -= 1
            if self.in_flight == 0:
                stats.read_busy_s += t.finished - self._busy_since
            self.intervals.append((t.started, t.finished))
            if error is None:
                t.outcome = "ok"
                table.pool.mark_ready(t.slot, t.layer, t.expert)
                stats.bytes += t.nbytes
                stats.hits += int(t.hit)
                stats.by_tier[t.tier] = stats.by_tier.get(t.tier, 0) + 1
            else:
                t.outcome, t.error = ("cancelled" if quiet else "error"), error
                stats.failed += int(not quiet)
                table.fail(t.slot, t.layer, t.expert, error)
                if not quiet:
                    log.warning("read_failed", layer=t.layer, expert=t.expert, error=str(error))
            table.cond.notify_all()

    # --- the outermost tier's RAM cache --------------------------------------------------
    def cached(self, layer: int, experts: list[int]) -> set[int]:
        """Those of `experts` of `layer` the outermost tier holds in RAM (a cache tier)."""
        tier = self.tier
        if not hasattr(type(tier), "__contains__"):  # not a cache tier (tiers/ram.py)
            return set()
        return {e for e in experts if ExpertKey(layer, e) in tier}  # type: ignore[operator]

    def copy_cached(self, layer: int, step: int, experts: list[int]) -> int:
        """Reserve `experts` of `layer` for `step` where a slot holds them (so no prefetch
        takes their slots before `acquire`), and copy those the outermost tier caches in RAM
        straight into free slots on the calling compute thread: a record copy instead of a
        trip through the event loop and a worker. Returns how many were copied."""
        table, pool, n = self.table, self.table.pool, 0
        copy = getattr(self.tier, "copy_cached", None)
        for e in experts:
            with table.lock:
                held = e in pool.where[layer]
                res = pool.reserve(layer, e, step) if held or copy is not None else None
            if res is None or held or copy is None:
                continue
            t0 = time.perf_counter()
            nbytes = copy(ExpertKey(layer, e), table.memory.dest(layer, res.slot))
            if nbytes and table.memory.widened:
                table.memory.widen(res.slot)
            with table.cond:
                if not nbytes:  # evicted since it was asked: `acquire` reads it
                    pool.clear(res.slot)
                    continue
                pool.mark_ready(res.slot, layer, e)
                self.intervals.append((t0, time.perf_counter()))
                self.stats.bytes += nbytes
                self.stats.hits += 1
                self.stats.by_tier[self.tier.name] = self.stats.by_tier.get(self.tier.name, 0) + 1
                n += 1
        return n

    # --- figures --------------------------------------------------------------------------
    def forget_spans(self) -> None:
        """Read spans so far are dropped (a new request: `io_time` never asks for them)."""
        self.intervals.clear()

    def io_time(self, since: float, until: float) -> float:
        """Wall time in [since, until] with at least one read in flight (union of reads)."""
        with self.table.lock:
            spans = sorted(
                (max(a, since), min(b, until)) for a, b in self.intervals if b > since and a < until
            )
        total, end = 0.0, since
        for a, b in spans:
            if b > end:
                total += b - max(a, end)
                end = b
        return total


def _read_error(t: FetchTicket, exc: Exception) -> BaseException:
    """A tier's failure as the error compute raises (an Edge0Error naming layer and expert)."""
    if isinstance(exc, Edge0Error):
        return exc
    return TierReadError(f"{type(exc).__name__}: {exc}", layer=t.layer, expert=t.expert)
