"""Reader threads: tickets read in need order off the event loop, over a tier stack whose every
tier reads on any thread (docs/runtime.md, "Threads").
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable

from edge0.errors import ConfigError
from edge0.log import get_logger
from edge0.runtime.io.tickets import FetchTicket

log = get_logger("edge0.runtime.io.readers")


class ReaderThreads:
    """`n` threads draining a priority queue of tickets; `work(ticket, i)` does one read."""

    def __init__(self, n: int, work: Callable[[FetchTicket, int], None]) -> None:
        self._work = work
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, int, FetchTicket]] = []
        self._seq = itertools.count()
        self._stopped = False
        self._threads: list[threading.Thread] = []
        for i in range(n):
            t = threading.Thread(target=self._run, args=(i,), name=f"edge0-reader-{i}", daemon=True)
            try:
                t.start()
            except RuntimeError as exc:  # "can't start new thread": a thread or memory limit
                self.stop()
                raise ConfigError(
                    f"cannot start I/O reader thread {i + 1} of {n} ({exc}); lower --io-workers "
                    "(io_workers=) or raise the process's thread limit (ulimit -u, pids.max)"
                ) from None
            self._threads.append(t)

    def put(self, tickets: list[FetchTicket]) -> None:
        """Queue `tickets` (any thread); one wake-up per ticket at most."""
        with self._cond:
            for t in tickets:
                step, order = t.sort_key()
                heapq.heappush(self._heap, (step, order, next(self._seq), t))
            self._cond.notify(len(tickets))

    def qsize(self) -> int:
        return len(self._heap)

    def _run(self, i: int) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                ticket = heapq.heappop(self._heap)[3]
            try:
                self._work(ticket, i)
            except BaseException as exc:  # noqa: BLE001 - `work` fails the ticket itself
                log.error(
                    "reader_crashed", layer=ticket.layer, expert=ticket.expert, error=repr(exc)
                )

    def stop(self) -> list[FetchTicket]:
        """Stop after the reads in flight (blocks until the threads end); returns the
        tickets still queued (never read)."""
        with self._cond:
            self._stopped = True
            left = [item[3] for item in self._heap]
            self._heap.clear()
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        return left
