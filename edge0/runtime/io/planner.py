"""The planner thread: the slot-table work compute defers (a sync group's fence move and
prefetches), applied in order under the scheduler's lock (docs/runtime.md, "Threads").
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from edge0.log import get_logger

log = get_logger("edge0.runtime.io.planner")

Op = tuple[Callable[..., list[Any]], tuple[Any, ...]]  # (apply, args) -> tickets to submit


class Planner:
    """A thread applying queued slot-table work in order; `drain` applies it on the caller."""

    def __init__(self, lock: threading.Lock, submit: Callable[[list[Any]], None]) -> None:
        self._lock = lock  # the scheduler's: every op runs under it
        self._submit = submit  # hands an applied batch's tickets to the readers
        self._ops: collections.deque[Op] = collections.deque()
        self._wake = threading.Event()
        self._stopped = False
        self._error: BaseException | None = None
        self.applied_here = 0  # ops applied on the planner thread (the rest: by `drain`)
        self.applied = 0
        self._thread = threading.Thread(target=self._run, name="edge0-planner", daemon=True)
        self._thread.start()

    def put(self, ops: list[Op], wake: bool = True) -> None:
        """Queue `ops` (the compute thread, in order); wake the thread (else they wait for
        the next wake-up or `drain`)."""
        self._ops.extend(ops)
        if wake:
            self._wake.set()

    def drain(self) -> None:
        """Apply every queued op now, on the calling thread (the scheduler's lock is held)."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        ops = self._ops
        if not ops:
            return
        new: list[Any] = []
        n = 0
        try:
            while ops:
                fn, args = ops.popleft()
                new += fn(*args)
                n += 1
        finally:  # what was applied is read, whatever failed after it
            self.applied += n
            self._submit(new)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            with self._lock:
                before = self.applied
                try:
                    self.drain()
                except BaseException as exc:  # noqa: BLE001 - raised on compute's next drain
                    log.error("planner_failed", error=repr(exc))
                    self._error = exc
                self.applied_here += self.applied - before

    def stop(self) -> None:
        """End the thread (blocks until it ends); ops still queued are dropped."""
        self._stopped = True
        self._wake.set()
        self._thread.join()
        self._ops.clear()
