"""The planner: the order in which tickets reach the readers (demand first, batched) and the
slot-table work compute defers to its thread (docs/runtime.md, "Threads")."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from edge0.log import get_logger

log = get_logger("edge0.runtime.io.planner")

Op = tuple[Callable[..., list[Any]], tuple[Any, ...]]  # (apply, args) -> tickets to submit
Key = tuple[int, int]  # (layer, step)


class Planner:
    """Issue order and deferred work. Before `start` every op is applied at once; after it, a
    thread applies queued ops in order under `lock`, and `drain` applies them on the caller."""

    def __init__(self, lock: threading.Lock, post: Callable[[list[Any]], None]) -> None:
        self._lock = lock  # the slot table's: every op runs under it
        self._post = post  # hands tickets to the readers now
        self._ops: collections.deque[Op] = collections.deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._error: BaseException | None = None
        self.applied_here = 0  # ops applied on the planner thread (the rest: by `drain`)
        self.applied = 0
        self._held: list[Any] | None = None  # tickets held back by `batched()`
        self._after: list[Any] | None = None  # prefetch tickets held by `demand_first()`
        self._deferring: list[Op] | None = None  # ops queued inside `deferred()`
        self._keys: list[Key] = []  # ... of which these are prefetches (see `queued`)
        self.queued: collections.Counter[Key] = collections.Counter()  # prefetches not applied

    def start(self) -> None:
        """Start the thread: from now on deferred work is applied on it."""
        self._thread = threading.Thread(target=self._run, name="edge0-planner", daemon=True)
        self._thread.start()

    # --- the order tickets reach the readers ------------------------------------------
    def submit(self, tickets: list[Any]) -> None:
        """Hand `tickets` on: now, or at the end of `batched()`."""
        if self._held is not None:  # inside `batched()`: one wake-up at its end
            self._held.extend(tickets)
            return
        self._post(tickets)

    def submit_prefetch(self, tickets: list[Any]) -> None:
        """Prefetch tickets: after the demand reads inside `demand_first()`, else `submit`."""
        if self._after is not None:
            self._after.extend(tickets)
        else:
            self.submit(tickets)

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Tickets issued inside reach the tier workers together: one event-loop wake-up."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            self.submit(held)

    @contextlib.contextmanager
    def demand_first(self) -> Iterator[None]:
        """Prefetch tickets issued inside reach the readers after the demand reads issued
        inside (at its end, or before compute waits): slots are reserved in the order asked,
        but a reader idle meanwhile never takes a next-step read ahead of this step's."""
        self._after = []
        try:
            yield
        finally:
            self.post_after()

    def post_after(self) -> None:
        """The prefetches `demand_first()` holds, handed on now."""
        held, self._after = self._after, None
        if held:
            self.submit(held)

    # --- deferred work ------------------------------------------------------------------
    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Work `defer`red inside is applied by the planner thread, in order, before anything
        else reads the slot table (not started: at once, one wake-up for the tickets)."""
        if self._thread is None:
            with self.batched():
                yield
            return
        ops: list[Op] = []
        self._deferring, self._keys = ops, []
        try:
            yield
        finally:
            self._deferring = None
            with self._lock:  # counted with the lock, which the ops' applier holds
                self.queued.update(self._keys)
            self.put(ops)

    def defer(
        self, fn: Callable[..., list[Any]], args: tuple[Any, ...], key: Key | None = None
    ) -> bool:
        """Inside `deferred()`: queue `fn(*args)` (a prefetch names its `key`: `queued` counts
        it until it is applied) and return True; else False (the caller applies it)."""
        ops = self._deferring
        if ops is None:
            return False
        if key is None:
            ops.append((fn, args))
        else:
            ops.append((self._keyed, (key, fn, args)))
            self._keys.append(key)
        return True

    def _keyed(self, key: Key, fn: Callable[..., list[Any]], args: tuple[Any, ...]) -> list[Any]:
        left = self.queued[key] - 1
        if left > 0:
            self.queued[key] = left
        else:
            del self.queued[key]
        return fn(*args)

    def soon(self, fn: Callable[..., list[Any]], *args: Any) -> None:
        """Run `fn(*args)` on the planner thread at its next wake-up (at once when there is
        none; the lock is held): bookkeeping that nothing on the compute thread waits for."""
        if self._thread is None:
            self._post(fn(*args))
        else:
            self.put([(fn, args)], wake=False)

    def put(self, ops: list[Op], wake: bool = True) -> None:
        """Queue `ops` (the compute thread, in order); wake the thread (else they wait for
        the next wake-up or `drain`)."""
        self._ops.extend(ops)
        if wake:
            self._wake.set()

    def drain(self) -> None:
        """Apply every queued op now, on the calling thread (the lock is held)."""
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
            self._post(new)

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
        if self._thread is not None:
            self._thread.join()
        self._ops.clear()
