"""The read side of the scheduler: fetch tickets read into slots by reader threads or loop
workers; read counters (docs/runtime.md, "Threads").
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time

import attrs

from edge0.errors import Edge0Error, TierReadError
from edge0.log import get_logger
from edge0.runtime.io.issue import Issuer
from edge0.runtime.io.planner import Op, Planner
from edge0.runtime.io.readers import ReaderThreads
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.slots import SlotPool
from edge0.runtime.io.tickets import PREFETCH, FetchTicket, ReadStats, TicketQueue
from edge0.runtime.io.trace import Tracer
from edge0.storage.tier import BlockingRead, ExpertKey, ReadInfo, Tier, blocking_read

log = get_logger("edge0.runtime.io.scheduler")


class Fetcher(Issuer):
    """Issues fetch tickets and runs their reads (reader threads, or tier workers on the loop)."""

    def __init__(
        self,
        tier: Tier,
        memory: SlotMemory,
        table: SlotPool,
        layer_order: list[int],
        tracer: Tracer,
        workers: int = 2,
    ) -> None:
        self.tier = tier
        self.memory = memory
        self.table = table
        self.order = {layer: i for i, layer in enumerate(layer_order)}
        self.tracer = tracer
        self.n_workers = workers
        self.stats = ReadStats()
        self.now = 0  # the step being computed
        self.request = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._loader: dict[tuple[int, int], FetchTicket] = {}  # (layer, slot) -> last ticket
        self._errors: dict[tuple[int, int], BaseException] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: TicketQueue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._readers: ReaderThreads | None = None  # reads off the loop (a blocking stack)
        self._blocking: BlockingRead | None = None
        self._in_flight = 0
        self._held: list[FetchTicket] | None = None  # tickets held back by `batched()`
        self._planner: Planner | None = None  # applies `deferred()` work (started by `start`)
        self._deferring: list[Op] | None = None  # work queued inside `deferred()`
        self._after: list[FetchTicket] | None = None  # prefetches held by `demand_first()`
        # (layer, step) -> prefetches for it queued for the planner, not yet applied
        self._queued: collections.Counter[tuple[int, int]] = collections.Counter()
        # (layer, step) -> experts prefetched for it: the only slots `acquire` may release
        self._ahead: dict[tuple[int, int], set[int]] = {}
        # (layer, step) -> the one set prefetched for it, in order (the step claim's input)
        self._planned: dict[tuple[int, int], list[int]] = {}
        self._closed = False
        self._busy_since = 0.0
        self._intervals: collections.deque[tuple[float, float]] = collections.deque(maxlen=1 << 18)

    # --- event loop side -------------------------------------------------------------
    async def start(self, threads: bool = True) -> None:
        """Start the reads: reader threads when the tier stack reads on any thread (and
        `threads`), else tier worker coroutines on this event loop."""
        self._loop = asyncio.get_running_loop()
        self._planner = Planner(self._lock, self._post)
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

    async def aclose(self) -> None:
        """Stop the workers; wake a compute thread still waiting for a read (it raises)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        if self._planner is not None:
            await asyncio.to_thread(self._planner.stop)
        if self._readers is not None:  # the reads in flight finish first
            await asyncio.to_thread(self._readers.stop)
        with self._cond:
            self._closed = True
            for t in self._loader.values():
                if t.outcome in ("queued", "running"):
                    t.outcome = "cancelled"
                    self.table.mark_failed(t.slot, t.layer, t.expert)
            self._cond.notify_all()

    def _begin(self, t: FetchTicket, wid: int) -> bool:
        """A worker takes `t` (False: it was cancelled while queued)."""
        with self._lock:
            if t.outcome != "queued":
                return False
            t.outcome, t.worker, t.started = "running", wid, time.perf_counter()
            if self._in_flight == 0:
                self._busy_since = t.started
            self._in_flight += 1
            return True

    def _read_here(self, t: FetchTicket, wid: int) -> None:
        """One read on a reader thread, start to finish (the loop takes no part)."""
        if not self._begin(t, wid):
            return
        assert self._blocking is not None
        info: ReadInfo | Exception
        try:
            info = self._blocking(ExpertKey(t.layer, t.expert), self.memory.dest(t.layer, t.slot))
            if self.memory.widened:  # scales/biases into the compute dtype
                self.memory.widen(t.slot)
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
        while True:
            t = await self._queue.get()
            if not self._begin(t, wid):
                continue  # cancelled while queued
            info: ReadInfo | Exception
            try:
                info = await self.tier.read_into(
                    ExpertKey(t.layer, t.expert), self.memory.dest(t.layer, t.slot)
                )
                if self.memory.widened:  # scales/biases into the compute dtype, off the loop
                    await asyncio.to_thread(self.memory.widen, t.slot)
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
        with self._cond:
            t.finished = time.perf_counter()
            self._in_flight -= 1
            if self._in_flight == 0:
                self.stats.read_busy_s += t.finished - self._busy_since
            self._intervals.append((t.started, t.finished))
            if error is None:
                t.outcome = "ok"
                self.table.mark_ready(t.slot, t.layer, t.expert)
                self.stats.bytes += t.nbytes
                self.stats.hits += int(t.hit)
                self.stats.by_tier[t.tier] = self.stats.by_tier.get(t.tier, 0) + 1
            else:
                t.outcome, t.error = ("cancelled" if quiet else "error"), error
                self.stats.failed += int(not quiet)
                self.table.mark_failed(t.slot, t.layer, t.expert)
                self._errors[(t.layer, t.slot)] = error
                if not quiet:
                    log.warning("read_failed", layer=t.layer, expert=t.expert, error=str(error))
            self._cond.notify_all()

    def counters(self) -> ReadStats:
        """A snapshot of the counters, deferred work applied first (any thread; brief lock)."""
        with self._lock:
            self._drain()
            return attrs.evolve(self.stats, by_tier=dict(self.stats.by_tier))

    def io_time(self, since: float, until: float) -> float:
        """Wall time in [since, until] with at least one read in flight (union of reads)."""
        with self._lock:
            spans = sorted(
                (max(a, since), min(b, until))
                for a, b in self._intervals
                if b > since and a < until
            )
        total, end = 0.0, since
        for a, b in spans:
            if b > end:
                total += b - max(a, end)
                end = b
        return total

    def end_request(self) -> int:
        """The request ended: its prefetches still queued are cancelled, never read."""
        n = 0
        with self._lock:
            self._drain()
            for t in self._loader.values():
                if t.outcome == "queued" and t.kind == PREFETCH and t.step > self.now:
                    t.outcome = "cancelled"
                    self.table.clear(t.slot)
                    n += 1
            self.stats.cancelled += n
        return n


def _read_error(t: FetchTicket, exc: Exception) -> BaseException:
    """A tier's failure as the error compute raises (an Edge0Error naming layer and expert)."""
    if isinstance(exc, Edge0Error):
        return exc
    return TierReadError(f"{type(exc).__name__}: {exc}", layer=t.layer, expert=t.expert)
