"""Reads off the event loop (reader threads, blocking tiers) and the step's slot claim."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PROMPT, build_store

from edge0.errors import TierReadError
from edge0.layout.manifest import Manifest
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.fetcher import Fetcher
from edge0.runtime.io.planner import Planner
from edge0.runtime.io.scheduler import Scheduler
from edge0.runtime.io.slots import SlotPool
from edge0.runtime.io.table import SlotTable
from edge0.runtime.io.trace import Tracer
from edge0.storage.spec import open_tiers
from edge0.storage.tier import ExpertKey, ReadInfo, Tier, blocking_read
from tiers.pread import PreadTier
from tiers.throttle import ThrottleTier

N = 8  # decode tokens
THROTTLED = "ram:64KiB>throttle:bw=1GB/s,lat=50us,qd=2>pread"


def build_stack(spec: str, path: Path) -> Tier:
    return open_tiers(spec, path, Manifest.load(path))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("readers"), "qwen3_5_moe", layers=6)


class LoopOnly:
    """The same stack without `read_blocking`: the scheduler reads through the event loop."""

    name = "loop-only"

    def __init__(self, inner: Tier) -> None:
        self.inner = inner

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        return await self.inner.read_into(key, dest)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _decode(
    path: Path, tiers: Any, mode: str = "route", n: int = N, **opts: Any
) -> tuple[list[int], Any]:
    async with Engine.open(path, tiers=tiers, mode=mode, predictor="init", **opts) as eng:
        toks = [t async for t in eng.tokens(PROMPT, max_tokens=n, stop=False)]
        return toks, eng.setup.scheduler.stats if eng.setup.scheduler else None


async def _no_loop(self: Any, key: ExpertKey, dest: memoryview) -> ReadInfo:
    raise AssertionError("a read went through the event loop")


def test_a_blocking_stack_reads_without_the_event_loop(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = build_stack("ram:64KiB>pread", store)
    assert blocking_read(stack) is not None
    assert blocking_read(LoopOnly(stack)) is None
    ref, _ = asyncio.run(_decode(store, LoopOnly(build_stack("ram:64KiB>pread", store))))
    monkeypatch.setattr(PreadTier, "read_into", _no_loop)
    got, stats = asyncio.run(_decode(store, stack))
    assert got == ref
    assert stats.issued > 0 and stats.failed == 0 and stats.consumed > 0


def test_a_throttle_stack_is_read_by_the_reader_threads(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert blocking_read(build_stack(THROTTLED, store)) is not None
    ref, _ = asyncio.run(_decode(store, "pread"))
    threads: set[str] = set()
    read = ThrottleTier.read_blocking

    def spy(self: ThrottleTier, key: ExpertKey, dest: memoryview) -> ReadInfo:
        threads.add(threading.current_thread().name)
        return read(self, key, dest)

    monkeypatch.setattr(ThrottleTier, "read_blocking", spy)
    for cls in (ThrottleTier, PreadTier):
        monkeypatch.setattr(cls, "read_into", _no_loop)
    got, stats = asyncio.run(_decode(store, THROTTLED))
    assert got == ref
    assert stats.issued > 0 and stats.failed == 0 and stats.by_tier.get("throttle", 0) > 0
    assert threads and all(name.startswith("edge0-reader-") for name in threads), threads


def test_route_tokens_are_the_same_on_threads_and_on_the_loop(store: Path) -> None:
    for spec in ("pread", "ram:64KiB>pread", "ram:1MiB>pread"):
        ref, _ = asyncio.run(_decode(store, LoopOnly(build_stack(spec, store))))
        got, _ = asyncio.run(_decode(store, spec))
        assert got == ref, spec
    resident, _ = asyncio.run(_decode(store, "pread", mode="resident"))
    reactive, _ = asyncio.run(_decode(store, "pread", mode="reactive"))
    assert reactive == resident  # the true routing, read on threads


@pytest.mark.parametrize("spec", ["pread", THROTTLED])
def test_a_failed_read_on_a_reader_thread_fails_the_request_and_not_the_engine(
    store: Path, spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = PreadTier._read_raw
    broken = {"on": True}

    def flaky(self: PreadTier, offset: int, length: int, dest: memoryview) -> int:
        if broken["on"]:
            raise OSError(5, "Input/output error")
        return raw(self, offset, length, dest)

    monkeypatch.setattr(PreadTier, "_read_raw", flaky)

    async def go() -> tuple[list[int], list[int]]:
        async with Engine.open(store, tiers=spec, mode="route", predictor="init") as eng:
            with pytest.raises(TierReadError, match=r"layer \d+, expert \d+"):
                _ = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]
            broken["on"] = False
            after = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]
        ref, _ = await _decode(store, "pread")
        return after, ref

    after, ref = asyncio.run(go())
    assert after == ref


# --- the step's slot claim, on the scheduler alone (reads finish at once) ----------------
class _NoTier:
    name = "none"


class _NoMemory:
    widened = ()


def _scheduler(layers: list[int], n_slots: int) -> Scheduler:
    table = SlotPool(layers, n_slots)

    def read_now(tickets: list[Any]) -> None:  # called under the lock: a finished read
        for t in tickets:
            t.outcome = "ok"
            table.mark_ready(t.slot, t.layer, t.expert)

    slots = SlotTable(table, _NoMemory())  # type: ignore[arg-type]
    fetcher = Fetcher(slots, _NoTier(), Tracer())  # type: ignore[arg-type]
    return Scheduler(slots, fetcher, Planner(slots.lock, read_now))


def _holds(sched: Scheduler, layer: int, experts: list[int], slots: list[int]) -> bool:
    got = [(sched.table.slots[s].layer, sched.table.slots[s].expert) for s in slots]
    return got == [(layer, e) for e in experts]


def test_one_acquire_claims_the_later_layers_of_the_step() -> None:
    sched = _scheduler([1, 2, 3], 12)
    plans = {1: [0, 1], 2: [2, 3], 3: [4, 5]}
    for layer, experts in plans.items():
        sched.prefetch(layer, 1, experts)
    sched.begin_step(1)
    slots = sched.acquire(1, 1, plans[1], fenced=False)
    assert _holds(sched, 1, plans[1], slots)
    assert set(sched._claims) == {2, 3}  # claimed in the same pass
    for layer in (2, 3):
        assert _holds(sched, layer, plans[layer], sched.acquire(layer, 1, plans[layer], False))
    assert sched.stats.demand == 0 and sched.stats.consumed == 6


def test_a_claim_is_not_used_after_a_steal_or_for_another_set() -> None:
    sched = _scheduler([1, 2, 3], 6)  # every slot taken by the prefetches
    plans = {1: [0, 1], 2: [2, 3], 3: [4, 5]}
    for layer, experts in plans.items():
        sched.prefetch(layer, 1, experts)
    sched.begin_step(1)
    sched.acquire(1, 1, plans[1], fenced=False)
    assert set(sched._claims) == {2, 3}
    # layer 2 runs another set than predicted (a misprediction): its claim is not used, the
    # set asked is read into the slots its prediction no longer needs
    other = [6, 7]
    slots = sched.acquire(2, 1, other, fenced=True)
    assert _holds(sched, 2, other, slots) and sched.stats.demand == 2
    # a full pool: layer 3's claimed slot is stolen for a demand read of layer 2 ...
    stolen = sched.table.steal(1, 2)
    assert stolen is not None and sched._claims[3][2] != sched.table.steals
    # ... so layer 3's acquire does not trust its claim: it reads the stolen expert again
    slots = sched.acquire(3, 1, plans[3], fenced=True)
    assert _holds(sched, 3, plans[3], slots) and sched.stats.demand == 3
