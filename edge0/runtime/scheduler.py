"""The scheduler: tier workers on the event loop fill slots; compute waits only for its own.

Threads (FACTS.md: MLX streams are thread-affine, eval releases the GIL):
- the event loop thread runs the tier workers (coroutines draining the ticket
  queue) and never blocks on compute;
- one compute thread (`ComputeThread`) builds and evaluates every MLX graph; at
  each streamed layer it calls `acquire`, which reserves slots, issues tickets
  for misses and blocks that thread (a threading.Condition) until its slots are
  ready; `prefetch` issues tickets for the next step and returns at once.
The slot pool (edge0.runtime.slots) is changed only under `self._lock`; its fence
moves when compute has evaluated a layer's input (`acquire(fenced=True)`, or
`evaluated` for route mode's deferred sync groups).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import attrs

from edge0.errors import Edge0Error, TierReadError
from edge0.log import get_logger
from edge0.runtime.slotmem import SlotMemory
from edge0.runtime.slots import SlotPool, SlotState
from edge0.runtime.tickets import DEMAND, PREFETCH, FetchTicket, TicketQueue
from edge0.runtime.trace import Tracer
from edge0.storage.tier import ExpertKey, Tier

T = TypeVar("T")
log = get_logger("edge0.runtime.scheduler")


class FenceNeeded(Exception):
    """acquire found the pool full of slots that unevaluated graphs may still read."""


class ComputeThread:
    """One thread that runs every MLX job, in submission order.

    Before it ends it releases the MLX streams it created (`mx.clear_streams`): a thread
    that exits holding them aborts the process about one run in 40 (FACTS.md).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="edge0-compute", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                fn, fut = job
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                    fut.set_exception(exc)
        finally:
            _release_streams()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        return fut

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the compute thread and await its result without blocking the loop."""
        return await asyncio.wrap_future(self.submit(fn))

    def close(self) -> None:
        """Finish the queued jobs, release the thread's MLX streams, and join it."""
        self._jobs.put(None)
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            log.warning("compute_thread_stuck", waited_s=30)


def _release_streams() -> None:
    import mlx.core as mx

    try:
        mx.synchronize()  # nothing of this thread may still run on a stream it frees
    except Exception as exc:  # noqa: BLE001 - a failed last job must not skip the release
        log.warning("compute_sync_failed", error=str(exc))
    mx.clear_streams()


@attrs.define
class ReadStats:
    """Counters of the scheduler (cumulative; the engine takes differences per request)."""

    issued: int = 0
    demand: int = 0
    prefetch: int = 0
    consumed: int = 0
    cancelled: int = 0
    failed: int = 0
    bytes: int = 0
    hits: int = 0  # served from a cache tier
    staged_hits: int = 0  # compute found the expert already staged or in flight
    staged_misses: int = 0  # compute had to issue a demand read
    fences: int = 0  # acquire found the pool full of unevaluated readers (FenceNeeded)
    read_busy_s: float = 0.0  # wall time with at least one read in flight
    by_tier: dict[str, int] = attrs.field(factory=dict)


class Scheduler:
    """Issues fetch tickets, runs the tier workers, and hands compute its slots."""

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
        self._in_flight = 0
        self._held: list[FetchTicket] | None = None  # tickets held back by `batched()`
        self._closed = False
        self._busy_since = 0.0
        self._intervals: collections.deque[tuple[float, float]] = collections.deque(maxlen=1 << 18)

    # --- event loop side -------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
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
        with self._cond:
            self._closed = True
            for t in self._loader.values():
                if t.outcome in ("queued", "running"):
                    t.outcome = "cancelled"
                    self.table.mark_failed(t.slot, t.layer, t.expert)
            self._cond.notify_all()

    def _enqueue(self, tickets: list[FetchTicket]) -> None:
        assert self._queue is not None
        for t in tickets:
            self._queue.put(t)

    async def _worker(self, wid: int) -> None:
        assert self._queue is not None
        while True:
            t = await self._queue.get()
            with self._lock:
                if t.outcome != "queued":
                    continue  # cancelled while queued
                t.outcome, t.worker, t.started = "running", wid, time.perf_counter()
                if self._in_flight == 0:
                    self._busy_since = t.started
                self._in_flight += 1
            try:
                info = await self.tier.read_into(
                    ExpertKey(t.layer, t.expert), self.memory.dest(t.layer, t.slot)
                )
                if self.memory.widened:  # scales/biases into the compute dtype, off the loop
                    await asyncio.to_thread(self.memory.widen, t.slot)
            except asyncio.CancelledError:  # the engine is closing
                self._finish(t, error=TierReadError("cancelled", layer=t.layer, expert=t.expert),
                             quiet=True)  # fmt: skip
                raise
            except Exception as exc:  # noqa: BLE001 - any tier failure fails this read only
                err = exc if isinstance(exc, Edge0Error) else TierReadError(
                    f"{type(exc).__name__}: {exc}", layer=t.layer, expert=t.expert
                )
                self._finish(t, error=err)
            else:
                t.tier, t.nbytes, t.hit = info.tier, info.nbytes, info.hit
                self._finish(t)
            self.tracer.read(t)

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

    def io_time(self, since: float, until: float) -> float:
        """Wall time in [since, until] with at least one read in flight (union of reads)."""
        with self._lock:
            spans = sorted((max(a, since), min(b, until)) for a, b in self._intervals
                           if b > since and a < until)  # fmt: skip
        total, end = 0.0, since
        for a, b in spans:
            if b > end:
                total += b - max(a, end)
                end = b
        return total

    # --- compute thread side ------------------------------------------------------------
    def begin_request(self, request: int) -> None:
        with self._lock:
            self.request = request
            self.table.clear_failed()
            self._errors.clear()
            self._intervals.clear()  # read spans of earlier requests: io_time never asks again

    def forget_failures(self) -> None:
        """Failed reads are forgotten (a batch ended the requests that needed them)."""
        with self._lock:
            self.table.clear_failed()
            self._errors.clear()

    def end_request(self) -> int:
        """The request ended: its prefetches still queued are cancelled, never read."""
        n = 0
        with self._lock:
            for t in self._loader.values():
                if t.outcome == "queued" and t.kind == PREFETCH and t.step > self.now:
                    t.outcome = "cancelled"
                    self.table.clear(t.slot)
                    n += 1
            self.stats.cancelled += n
        return n

    def begin_step(self, step: int) -> None:
        """Compute starts `step`: every graph of earlier steps has been evaluated (the fence)."""
        with self._lock:
            self.now = step
            self.table.advance(step - 1)

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
        if not tickets:
            return
        if self._held is not None:  # inside `batched()`: one wake-up at its end
            self._held.extend(tickets)
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

    def prefetch(self, layer: int, step: int, experts: list[int]) -> int:
        """Stage `experts` of `layer` for `step` (one ahead); returns how many reads were issued."""
        new = []
        with self._lock:
            for e in experts:
                got = self._issue(layer, step, e, PREFETCH)
                if got is not None and got[1] is not None:
                    new.append(got[1])
            self._submit(new)
        return len(new)

    def evaluated(self, step: int, layer: int) -> None:
        """Compute evaluated every graph of `step` before `layer` (their slots may be reused)."""
        order = self.order.get(layer)
        if order is None:
            return
        with self._cond:
            self.table.advance(step, order - 1)
            self._cond.notify_all()

    def acquire(self, layer: int, step: int, experts: list[int], fenced: bool = True) -> list[int]:
        """Slots holding `experts` of `layer`, ready for `step`; blocks until they are.

        `fenced`: compute evaluated the graph that produced this layer's input, so every
        earlier layer of `step` is done with its slots (they may be rewritten). Without
        it (route mode's deferred syncs) the fence stays where `evaluated` put it, and a
        full pool raises `FenceNeeded` so compute can evaluate and ask again.
        """
        table = self.table
        with self._cond:
            if fenced:
                table.advance(step, table.order[layer] - 1)
            self._release_unneeded(layer, step, set(experts))
            slots: list[int] = []
            new: list[FetchTicket] = []
            for e in experts:
                got = self._issue(layer, step, e, DEMAND)
                while got is None:  # no free slot: take back a later prefetch, or wait for one
                    if table.steal(step, layer) is None:
                        if not table.any_loading():
                            self._submit(new)
                            if not fenced:  # slots wait on unevaluated graphs: evaluate first
                                self.stats.fences += 1
                                raise FenceNeeded(layer)
                            raise RuntimeError(f"slot pool is over capacity at layer {layer}")
                        self._submit(new)
                        new = []
                        self._wait()
                    got = self._issue(layer, step, e, DEMAND)
                slots.append(got[0])
                if got[1] is not None:
                    new.append(got[1])
            self._submit(new)
            self.stats.staged_misses += len(new)
            self.stats.staged_hits += len(experts) - len(new)
            while any(table.state(s) is SlotState.LOADING for s in slots):
                self._wait()
            for s, e in zip(slots, experts, strict=True):
                if table.state(s) is not SlotState.READY:
                    raise self._errors.get((layer, s)) or TierReadError(
                        "slot lost its record", layer=layer, expert=e
                    )
                t = self._loader.get((layer, s))
                if t is not None and not t.consumed and t.expert == e:
                    t.consumed = True
                    self.stats.consumed += 1
        return slots

    def _wait(self) -> None:
        if self._closed:
            raise Edge0Error("the engine closed while compute waited for expert reads")
        self._cond.wait()

    def _release_unneeded(self, layer: int, step: int, needed: set[int]) -> None:
        """Predicted experts that compute will not read at `step`: free them (cancel if queued)."""
        table = self.table
        for e, s in list(table.where[layer].items()):
            if e in needed or not table.reserved_for(s, step):
                continue
            table.release(layer, e, step)
            t = self._loader.get((layer, s))
            if t is not None and t.outcome == "queued":
                t.outcome = "cancelled"
                self.stats.cancelled += 1
                table.clear(s)
