"""Admission control: at most `max_batch` choices decode, at most `max_queue` wait, the rest get
429 (Anthropic: 529) with Retry-After.

A request asks for one place per choice (`n`). While places are free it takes them at
once; otherwise it waits in a first-come, first-served queue of at most `max_queue`
choices; past that it is refused before any work is done (`check` runs before the
prompt is tokenized, `place` again when the request is about to start). Retry-After is
the expected wait for the queue ahead to drain: the recent mean time a request held its
places, times the choices ahead per place.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import AsyncIterator

from edge0.errors import RequestError
from edge0.server.metrics import ServerMetrics

RETRY_AFTER_S = (1, 60)  # the range of the Retry-After estimate, seconds
_SMOOTHING = 0.2  # weight of the latest request in the mean hold time


class Admission:
    """The places of the engine's batch and the queue in front of them."""

    def __init__(
        self,
        places: int,
        max_queue: int,
        metrics: ServerMetrics,
    ) -> None:
        self.places = places
        self.max_queue = max_queue
        self.metrics = metrics
        self.busy = 0  # places held
        self.waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self.queued = 0  # choices waiting
        self.hold_s = 1.0  # mean seconds a request held its places (smoothed)

    def check(self, n: int) -> None:
        """Refuse now (Overloaded) when `n` more choices could neither start nor wait."""
        if not self._fits(n) and self.queued + n > self.max_queue:
            raise self._refusal(n)

    @contextlib.asynccontextmanager
    async def place(self, n: int) -> AsyncIterator[None]:
        """Hold `n` places for the block: at once, after a wait in the queue, or refused."""
        start = time.perf_counter()
        if self._fits(n) and not self.waiting:
            self.busy += n
        else:
            self.check(n)
            await self._wait(n)
        self.metrics.queue_wait.observe(time.perf_counter() - start)
        held = time.perf_counter()
        try:
            yield
        finally:
            hold = time.perf_counter() - held
            self.hold_s += _SMOOTHING * (hold - self.hold_s)
            self._release(n)

    def retry_after(self, n: int = 1) -> int:
        """Seconds until `n` more choices could expect a place (clamped to RETRY_AFTER_S)."""
        ahead = self.queued + n
        lo, hi = RETRY_AFTER_S
        return min(hi, max(lo, math.ceil(self.hold_s * ahead / self.places)))

    def _fits(self, n: int) -> bool:
        return self.busy + n <= self.places

    async def _wait(self, n: int) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((n, fut))
        self._queue_changed(n)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():  # the place came with the cancellation
                self._release(n)
            elif (n, fut) in self.waiting:
                self.waiting.remove((n, fut))
                self._queue_changed(-n)
                self._wake()  # the ones behind may fit now
            raise

    def _release(self, n: int) -> None:
        self.busy -= n
        self._wake()

    def _wake(self) -> None:
        """Give places to the waiters at the head of the queue while they fit."""
        while self.waiting and self._fits(self.waiting[0][0]):
            need, fut = self.waiting.popleft()
            self._queue_changed(-need)
            if fut.cancelled():  # its task is unwinding: nothing to give
                continue
            self.busy += need
            fut.set_result(None)

    def _queue_changed(self, delta: int) -> None:
        self.queued += delta
        self.metrics.queue_depth.set(self.queued)

    def _refusal(self, n: int) -> RequestError:
        self.metrics.refusals.labels(reason="queue_full").inc()
        return RequestError(
            f"the server is busy: {self.busy} requests decoding and {self.queued} waiting, "
            f"the most it queues (`edge0 serve --max-queue {self.max_queue}`); retry after "
            "the time in Retry-After",
            status=429,
            code="rate_limit_exceeded",
            headers={"retry-after": str(self.retry_after(n))},
        )
