"""What the server does when a burst is over: give the heap's free pages back to the OS.

The worker threads that parse bodies and tokenize prompts each allocate from a glibc
arena of their own; after a burst their free pages stay resident. Once no HTTP request
has been in flight for TRIM_DELAY_S (the metrics middleware counts them, the connection
layer's refusals call in too), `IdleTrim` runs `edge0.heap.trim` in a worker thread
(never on the event loop: it walks every arena).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from edge0 import heap
from edge0.log import get_logger

log = get_logger("edge0.server")
TRIM_DELAY_S = 1.0
WORKER_THREADS = 4  # the server's default executor: bodies, prompts, grammars (bounded)


class IdleTrim:
    """`soon()` when the server may have fallen idle; trims once `idle()` has held for
    TRIM_DELAY_S."""

    def __init__(
        self,
        idle: Callable[[], bool],
        delay: float = TRIM_DELAY_S,
        counter: Callable[[], None] | None = None,
    ) -> None:
        self.idle = idle
        self.delay = delay
        self.counter = counter  # called at each trim (the metrics' count)
        self.trims = 0
        self._timer: asyncio.TimerHandle | None = None

    def soon(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self.idle():
            self.trims += 1
            if self.counter is not None:
                self.counter()
            asyncio.get_running_loop().run_in_executor(None, heap.trim)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
