"""`ram`: a byte-budgeted in-memory cache of expert records over an inner tier (LRU or LFUDA)
(docs/tiers.md, "ram": copies off the event loop, coalesced misses, pins).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, cast

import attrs
import numpy as np

from edge0.errors import TierReadError
from edge0.log import get_logger
from edge0.storage.spec import choice, parse_int, parse_size
from edge0.storage.tier import ExpertKey, ReadInfo, Tier
from tiers._disk import byte_view, flat_bytes, run_in_pool
from tiers._evict import make_policy

log = get_logger("edge0.tiers.ram")

# What a leader's miss hands to readers of the same key that waited for it:
# (record copy, error, inner ReadInfo). A None copy without error means the leader
# was cancelled (or failed unexpectedly): the waiter reads the record itself.
_Outcome = tuple["np.ndarray | None", "TierReadError | None", "ReadInfo | None"]


@attrs.define
class RamStats:
    hits: int = 0  # served from the cache
    misses: int = 0  # read from the inner tier by this reader
    coalesced: int = 0  # waited for another reader's miss of the same key
    inserts: int = 0
    evictions: int = 0
    not_cached: int = 0  # a read record that did not fit (budget full of pinned records)
    bytes_used: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses + self.coalesced
        return self.hits / total if total else 0.0


class RamTier:
    """Keeps copies of recently or frequently read records within `budget` bytes.

    A record enters the cache only after the inner tier returned it (and, for
    disk tiers, verified its CRC): a failed or cancelled read is never cached.
    Concurrent misses of one key are coalesced into one inner read. Pinned keys
    are never evicted.
    """

    name: ClassVar[str] = "ram"
    WRAPS: ClassVar[bool] = True
    POSITIONAL: ClassVar[str | None] = "budget"
    OPTIONS: ClassVar[dict[str, Callable[[str], Any]]] = {
        "budget": parse_size,
        "policy": choice("lru", "lfuda"),
        "workers": parse_int,
    }

    def __init__(
        self, inner: Tier, *, budget: int = 1 << 30, policy: str = "lru", workers: int = 2
    ) -> None:
        self.inner = inner
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="edge0-ram")
        self.budget = budget
        self.policy_name = policy
        self.stats = RamStats()
        self._policy = make_policy(policy)
        self._entries: dict[ExpertKey, np.ndarray] = {}  # key -> (record_size,) uint8 copy
        self._pinned: set[ExpertKey] = set()
        self._inflight: dict[ExpertKey, asyncio.Future[_Outcome]] = {}
        # the blocking path: its cache bookkeeping under one lock, misses coalesced per key
        self._mu = threading.Lock()
        self._waiting: dict[ExpertKey, concurrent.futures.Future[_Outcome]] = {}

    @property
    def blocking(self) -> bool:
        """Whether `read_blocking` works (the inner tier reads on any thread too)."""
        return bool(getattr(self.inner, "blocking", False))

    # --- the Tier interface ----------------------------------------------
    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        if self.blocking:  # one thread hop for the whole read
            return await run_in_pool(self._pool, self.read_blocking, key, dest)
        started = time.perf_counter()
        while True:
            rec = self._entries.get(key)
            if rec is not None:  # 1. hit: copy our record into the caller's buffer
                if key not in self._pinned:
                    self._policy.touch(key)
                self.stats.hits += 1
                await run_in_pool(self._pool, _copy, rec, byte_view(dest, rec.nbytes))
                return ReadInfo(self.name, rec.nbytes, started, time.perf_counter(), hit=True)
            fut = self._inflight.get(key)
            if fut is None:  # 2. miss: this reader reads from the inner tier
                return await self._miss(key, dest, started)
            # 3. another reader is fetching this key: wait for it, copy its record
            rec, err, info = await asyncio.shield(fut)
            if err is not None:
                raise err
            if rec is not None and info is not None:
                await run_in_pool(self._pool, _copy, rec, byte_view(dest, rec.nbytes))
                self.stats.coalesced += 1
                now = time.perf_counter()
                return ReadInfo(info.tier, rec.nbytes, started, now, waited=now - started)
            # the leader was cancelled: loop and read it ourselves

    def read_blocking(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        """The read on the calling thread (only when `blocking`): a hit is a copy; a miss
        reads the inner tier, and readers of the same key meanwhile wait for that read."""
        started = time.perf_counter()
        while True:
            with self._mu:
                rec = self._entries.get(key)
                fut = None if rec is not None else self._waiting.get(key)
                if rec is not None:
                    if key not in self._pinned:
                        self._policy.touch(key)
                    self.stats.hits += 1
                elif fut is None:  # this reader reads it
                    mine: concurrent.futures.Future[_Outcome] = concurrent.futures.Future()
                    self._waiting[key] = mine
            if rec is not None:  # 1. hit
                _copy(rec, byte_view(dest, rec.nbytes))
                return ReadInfo(self.name, rec.nbytes, started, time.perf_counter(), hit=True)
            if fut is None:  # 2. miss
                return self._miss_blocking(key, dest, started, mine)
            rec, err, info = fut.result()  # 3. another thread reads this key: use its copy
            if err is not None:
                raise err
            if rec is not None and info is not None:
                _copy(rec, byte_view(dest, rec.nbytes))
                with self._mu:
                    self.stats.coalesced += 1
                now = time.perf_counter()
                return ReadInfo(info.tier, rec.nbytes, started, now, waited=now - started)

    def _miss_blocking(
        self,
        key: ExpertKey,
        dest: memoryview,
        started: float,
        fut: concurrent.futures.Future[_Outcome],
    ) -> ReadInfo:
        outcome: _Outcome = (None, None, None)
        try:
            info = self.inner.read_blocking(key, dest)  # type: ignore[attr-defined]
            rec = _snapshot(flat_bytes(dest))
            outcome = (rec, None, info)
            return self._keep(key, rec, info, started)
        except TierReadError as exc:
            outcome = (None, exc, None)
            raise
        finally:  # success or error: release the waiters either way
            with self._mu:
                del self._waiting[key]
            fut.set_result(outcome)

    async def aclose(self) -> None:
        self._entries.clear()
        self.stats.bytes_used = 0
        self._pool.shutdown(wait=False)
        await self.inner.aclose()

    # --- pinning and inspection -------------------------------------------
    def pin(self, keys: Iterable[ExpertKey]) -> None:
        """Never evict these keys (now cached or cached later) until `unpin`."""
        with self._mu:
            self._pin(keys)

    def _pin(self, keys: Iterable[ExpertKey]) -> None:
        for key in keys:
            if key not in self._pinned and key in self._entries:
                self._policy.remove(key)
            self._pinned.add(key)

    def unpin(self, keys: Iterable[ExpertKey]) -> None:
        with self._mu:
            self._unpin(keys)

    def _unpin(self, keys: Iterable[ExpertKey]) -> None:
        for key in keys:
            if key in self._pinned:
                self._pinned.discard(key)
                if key in self._entries:
                    self._policy.insert(key)

    async def prefetch(
        self, keys: Iterable[ExpertKey], record_size: int, *, pin: bool = False
    ) -> None:
        """Read `keys` into the cache (pinning them first if asked)."""
        keys = list(keys)
        if pin:
            self.pin(keys)
        scratch = np.empty(record_size, np.uint8)
        for key in keys:
            if key not in self._entries:
                await self.read_into(key, scratch.data)

    def copy_cached(self, key: ExpertKey, dest: memoryview) -> int:
        """Copy a cached record into `dest` on the calling thread (route policies stage RAM
        hits from the compute thread); 0 when `key` is not cached. The eviction order is not
        touched (it belongs to the event loop)."""
        rec = self._entries.get(key)
        if rec is None:
            return 0
        _copy(rec, byte_view(dest, rec.nbytes))
        self.stats.hits += 1
        return int(rec.nbytes)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def pinned(self) -> frozenset[ExpertKey]:
        return frozenset(self._pinned)

    # --- internals --------------------------------------------------------
    async def _miss(self, key: ExpertKey, dest: memoryview, started: float) -> ReadInfo:
        fut: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        outcome: _Outcome = (None, None, None)
        try:
            info = await self.inner.read_into(key, dest)
            rec = await run_in_pool(self._pool, _snapshot, flat_bytes(dest))
            outcome = (rec, None, info)
            return self._keep(key, rec, info, started)
        except TierReadError as exc:
            outcome = (None, exc, None)
            raise
        finally:  # success, error or cancellation: release the waiters either way
            del self._inflight[key]
            fut.set_result(outcome)

    def _keep(self, key: ExpertKey, rec: np.ndarray, info: ReadInfo, started: float) -> ReadInfo:
        """A miss's record read from the inner tier: counted and cached (under the lock: both
        miss paths, the loop's and the reader threads', may run on one cache)."""
        with self._mu:
            self.stats.misses += 1
            self._insert(key, rec)
        return attrs.evolve(info, started=started, finished=time.perf_counter())

    def _insert(self, key: ExpertKey, rec: np.ndarray) -> None:
        if rec.nbytes > self.budget:
            self.stats.not_cached += 1
            return
        while self.stats.bytes_used + rec.nbytes > self.budget:
            victim: Hashable | None = self._policy.victim()
            if victim is None:  # everything left is pinned
                self.stats.not_cached += 1
                log.debug(
                    "ram.not_cached",
                    layer=key.layer,
                    expert=key.expert,
                    reason="budget full of pinned records",
                )
                return
            self._policy.evicted(victim)
            evicted = self._entries.pop(cast(ExpertKey, victim))
            self.stats.bytes_used -= evicted.nbytes
            self.stats.evictions += 1
        self._entries[key] = rec
        self.stats.bytes_used += rec.nbytes
        self.stats.inserts += 1
        if key not in self._pinned:
            self._policy.insert(key)


def _copy(rec: np.ndarray, dest: memoryview) -> None:
    """A cached record into the caller's buffer (in a worker thread)."""
    np.copyto(np.frombuffer(dest, np.uint8), rec)


def _snapshot(dest: memoryview) -> np.ndarray:
    """Our own (record_size,) copy of a record just read (in a worker thread)."""
    return np.frombuffer(dest, np.uint8).copy()
