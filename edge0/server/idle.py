"""What the server does when a burst is over: give the memory it freed back to the OS.

Two caches keep freed memory resident: MLX's buffer cache (the batch's intermediate
arrays, tens of MiB after a burst of batched decode) and glibc's arenas (one per thread
that allocates: the compute thread's MLX buffers, the workers that parse bodies and
tokenize prompts). Once no HTTP request has been in flight for TRIM_DELAY_S (the metrics
middleware counts them; the connection layer's refusals call in too), `IdleTrim` runs
`give_back`: MLX's cache cleared on the engine's compute thread, then `edge0.heap.trim`
in a worker thread (never on the event loop: it walks every arena). The next request
allocates its buffers afresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import mlx.core as mx

from edge0 import heap
from edge0.log import get_logger
from edge0.runtime.engine.api import Engine

log = get_logger("edge0.server")
TRIM_DELAY_S = 1.0
WORKER_THREADS = 4  # the server's default executor: bodies, prompts, grammars (bounded)


async def give_back(engine: Engine) -> None:
    """MLX's buffer cache cleared (on the compute thread, between requests), then glibc's
    free pages returned to the OS."""
    await engine.run_on_compute(mx.clear_cache)
    await asyncio.to_thread(heap.trim)


class IdleTrim:
    """`soon()` when the server may have fallen idle; runs `action` once `idle()` has held for
    `delay` seconds (a call while one runs is not doubled)."""

    def __init__(
        self,
        idle: Callable[[], bool],
        action: Callable[[], Awaitable[None]],
        delay: float = TRIM_DELAY_S,
    ) -> None:
        self.idle = idle
        self.action = action
        self.delay = delay
        self.trims = 0
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Task[None] | None = None

    def soon(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self.idle() and (self._running is None or self._running.done()):
            self.trims += 1
            self._running = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            await self.action()
        except Exception:  # the server goes on: the next idle moment tries again
            log.exception("server.trim_failed")

    async def close(self) -> None:
        """No more trims; waits for one under way."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)
