"""The RAM tier: LRU/LFUDA eviction, pinning, statistics, coalescing, failures and cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from tiers_helpers import FaultyTier, all_keys, plain_read, tiny_store

from edge0.errors import TierReadError
from edge0.layout.manifest import Manifest
from edge0.storage.tier import ExpertKey
from tiers.pread import PreadTier
from tiers.ram import RamTier


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    d = tmp_path_factory.mktemp("store")
    return d, tiny_store(d)


def _ram(store: tuple[Path, Manifest], n_records: int, **kw: object) -> tuple[RamTier, FaultyTier]:
    d, m = store
    inner = FaultyTier(PreadTier(d, m), **kw)  # type: ignore[arg-type]
    return RamTier(inner, budget=n_records * m.record_size, policy="lru"), inner


async def _read(tier: RamTier, m: Manifest, *keys: ExpertKey) -> None:
    for key in keys:
        await tier.read_into(key, bytearray(m.record_size))


def test_lru_evicts_least_recently_used(store) -> None:  # type: ignore[no-untyped-def]
    m = store[1]
    a, b, c = all_keys(m)[:3]
    tier, inner = _ram(store, 2)
    asyncio.run(_read(tier, m, a, b, a, c))  # a is fresher than b -> b goes
    assert a in tier and c in tier and b not in tier
    s = tier.stats
    assert (s.hits, s.misses, s.evictions, s.bytes_used) == (1, 3, 1, 2 * m.record_size)
    assert inner.reads == 3 and s.hit_rate == pytest.approx(0.25)
    asyncio.run(tier.aclose())


def test_lfuda_keeps_frequent_then_ages(store) -> None:  # type: ignore[no-untyped-def]
    m = store[1]
    a, b, c, d, e = all_keys(m)[:5]
    tier, _ = _ram(store, 2)
    tier = RamTier(tier.inner, budget=2 * m.record_size, policy="lfuda")
    asyncio.run(_read(tier, m, a, a, a, b, c))  # priorities a=3, b=1 -> b evicted, age 1
    assert a in tier and c in tier and b not in tier
    asyncio.run(_read(tier, m, d))  # c=2 < a=3 -> c evicted, age 2, d=3
    assert a in tier and d in tier
    asyncio.run(_read(tier, m, e))  # a=3 ties d=3, a is older -> a evicted despite 3 hits
    assert d in tier and e in tier and a not in tier
    assert tier.stats.evictions == 3
    asyncio.run(tier.aclose())


def test_pinned_records_stay(store) -> None:  # type: ignore[no-untyped-def]
    m = store[1]
    a, b, c, d = all_keys(m)[:4]
    tier, inner = _ram(store, 2)
    tier.pin([a])
    asyncio.run(_read(tier, m, a, b, c, d))
    assert a in tier and d in tier and tier.stats.evictions == 2
    tier.unpin([a])
    asyncio.run(_read(tier, m, b, c))  # unpinned a counts as just used: d goes, then a
    assert a not in tier and d not in tier
    one, inner = _ram(store, 1)
    one.pin([a])
    asyncio.run(_read(one, m, a, b, b))  # budget full of pinned a: b is served, not kept
    assert b not in one and one.stats.not_cached == 2 and inner.reads == 3


def test_prefetch_pins_and_fills(store) -> None:  # type: ignore[no-untyped-def]
    m = store[1]
    keys = all_keys(m)[:3]
    tier, inner = _ram(store, 4)
    asyncio.run(tier.prefetch(keys, m.record_size, pin=True))
    assert all(k in tier for k in keys) and tier.pinned == frozenset(keys)
    asyncio.run(_read(tier, m, *keys))
    assert inner.reads == 3 and tier.stats.hits == 3


def test_concurrent_misses_coalesce(store) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    key = all_keys(m)[7]

    async def main() -> None:
        gate = asyncio.Event()
        tier, inner = _ram(store, 4, gate=gate)
        bufs = [np.zeros(m.record_size, np.uint8) for _ in range(5)]
        tasks = [asyncio.create_task(tier.read_into(key, b.data)) for b in bufs]
        await asyncio.sleep(0.01)
        gate.set()
        infos = await asyncio.gather(*tasks)
        assert inner.reads == 1
        assert (tier.stats.misses, tier.stats.coalesced) == (1, 4)
        assert all(b.tobytes() == plain_read(d, m, key) for b in bufs)
        assert sum(i.waited > 0 for i in infos) == 4
        await tier.aclose()

    asyncio.run(main())


def test_failed_read_is_not_cached_and_reaches_waiters(store) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    key = all_keys(m)[2]

    async def main() -> None:
        gate = asyncio.Event()
        tier, inner = _ram(store, 4, failures=1, gate=gate)
        tasks = [
            asyncio.create_task(tier.read_into(key, bytearray(m.record_size))) for _ in range(3)
        ]
        await asyncio.sleep(0.01)
        gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, TierReadError) for r in results)
        assert key not in tier and inner.reads == 1
        buf = bytearray(m.record_size)
        await tier.read_into(key, memoryview(buf))  # the inner tier works again
        assert key in tier and bytes(buf) == plain_read(d, m, key)
        await tier.aclose()

    asyncio.run(main())


def test_cancelled_read_is_not_cached(store) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    key = all_keys(m)[4]

    async def main() -> None:
        gate = asyncio.Event()
        tier, inner = _ram(store, 4, gate=gate)
        leader = asyncio.create_task(tier.read_into(key, bytearray(m.record_size)))
        await asyncio.sleep(0.01)
        buf = np.zeros(m.record_size, np.uint8)
        waiter = asyncio.create_task(tier.read_into(key, buf.data))
        await asyncio.sleep(0.01)
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leader
        assert key not in tier and not tier._inflight
        gate.set()
        await waiter  # the waiter reads the record itself
        assert buf.tobytes() == plain_read(d, m, key)
        assert inner.reads == 2 and key in tier
        await tier.aclose()

    asyncio.run(main())


def test_record_copies_run_in_worker_threads(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Neither a hit's copy nor a miss's snapshot runs on the event loop's thread."""
    import threading

    import tiers.ram as ram

    d, m = store
    seen: list[tuple[str, str]] = []
    for name in ("_copy", "_snapshot"):
        original = getattr(ram, name)

        def spy(*args, _name=name, _original=original):  # type: ignore[no-untyped-def]
            seen.append((_name, threading.current_thread().name))
            return _original(*args)

        monkeypatch.setattr(ram, name, spy)
    a = all_keys(m)[0]
    tier, _ = _ram(store, 4)
    buf = bytearray(m.record_size)

    async def main() -> str:
        await tier.read_into(a, bytearray(m.record_size))  # miss: snapshot for the cache
        await tier.read_into(a, buf)  # hit: copy into the caller's buffer
        return threading.current_thread().name

    loop_thread = asyncio.run(main())
    assert {n for n, _ in seen} == {"_copy", "_snapshot"}
    assert all(t.startswith("edge0-ram") and t != loop_thread for _, t in seen), seen
    assert bytes(buf) == plain_read(d, m, a)
