"""The I/O room's parts, each built on its own (no engine, no scheduler), and compute's view of
the whole: exactly `acquire` and `prefetch`."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edge0.errors import Edge0Error, TierReadError
from edge0.runtime.io.fetcher import Fetcher
from edge0.runtime.io.planner import Planner
from edge0.runtime.io.scheduler import Scheduler
from edge0.runtime.io.slots import SlotPool, SlotState
from edge0.runtime.io.source import ExpertSource, StepIO
from edge0.runtime.io.table import SlotTable
from edge0.runtime.io.tickets import DEMAND, PREFETCH
from edge0.runtime.io.trace import Tracer
from edge0.storage.tier import ExpertKey, ReadInfo

ROOT = Path(__file__).resolve().parents[1]


class _Memory:
    widened = ()

    def __init__(self) -> None:
        self.buffers: dict[int, bytearray] = {}

    def dest(self, layer: int, slot: int) -> bytearray:
        return self.buffers.setdefault(slot, bytearray(4))


class _Tier:
    """Each record is 4 bytes: its layer and expert; expert 13 fails."""

    name = "mem"

    async def read_into(self, key: ExpertKey, dest: Any) -> ReadInfo:
        if key.expert == 13:
            raise OSError("bad sector")
        dest[:] = bytes([key.layer, key.expert, 0, 0])
        now = time.perf_counter()
        return ReadInfo("mem", 4, now, now)


def _table(n_slots: int = 4) -> SlotTable:
    return SlotTable(SlotPool([1, 2], n_slots), _Memory())  # type: ignore[arg-type]


# --- the slot table ----------------------------------------------------------------------
def test_slot_table_keeps_failures_and_answers_what_is_ready() -> None:
    table = _table()
    pool = table.pool
    with table.lock:
        a, b = (pool.reserve(1, e, 0) for e in (5, 6))
        assert a is not None and b is not None and a.needs_read
        pool.mark_ready(a.slot, 1, 5)
        table.fail(b.slot, 1, 6, TierReadError("bad", layer=1, expert=6))
        assert table.ready(1, [5, 6, 7]) == {5}
        assert table.staged(1, skip=set()) == [5] and table.staged(1, skip={5}) == []
        table.check(1, a.slot, 5)
        with pytest.raises(TierReadError, match="bad"):
            table.check(1, b.slot, 6)
        table.forget_failures()
        assert pool.state(b.slot) is SlotState.EMPTY and not table.errors
        table.close()
        with pytest.raises(Edge0Error, match="closed"):
            table.wait()


# --- the fetcher -------------------------------------------------------------------------
def test_fetcher_issues_tickets_and_reads_them_into_the_table() -> None:
    table = _table()
    fetcher = Fetcher(table, _Tier(), Tracer(), workers=1)  # type: ignore[arg-type]

    async def go() -> None:
        await fetcher.start(threads=False)
        with table.lock:
            got = [fetcher.issue(0, 1, 0, e, DEMAND) for e in (5, 13)]
            again = fetcher.issue(0, 1, 0, 5, PREFETCH)  # already in a slot: no ticket
        assert again is not None and again[1] is None
        tickets = [g[1] for g in got if g is not None and g[1] is not None]
        assert len(tickets) == 2
        fetcher.post(tickets)
        end = time.monotonic() + 10
        while any(t.outcome in ("queued", "running") for t in tickets):  # workers on this loop
            assert time.monotonic() < end, "the reads did not finish"
            await asyncio.sleep(0.001)
        await fetcher.stop()
        ok, bad = tickets
        assert ok.outcome == "ok" and table.memory.dest(1, ok.slot)[:2] == bytes([1, 5])
        assert bad.outcome == "error" and isinstance(table.errors[(1, bad.slot)], TierReadError)
        assert fetcher.stats.issued == 2 and fetcher.stats.demand == 2
        assert fetcher.stats.bytes == 4 and fetcher.stats.failed == 1
        assert fetcher.layers_read == {1} and fetcher.io_time(0.0, time.perf_counter()) > 0

    asyncio.run(go())


def test_fetcher_cancels_a_queued_ticket() -> None:
    table = _table()
    fetcher = Fetcher(table, _Tier(), Tracer())  # type: ignore[arg-type]
    with table.lock:
        got = fetcher.issue(0, 2, 3, 7, PREFETCH)
        assert got is not None and got[1] is not None
        fetcher.cancel(got[1])
    assert got[1].outcome == "cancelled" and fetcher.stats.cancelled == 1
    assert table.pool.slot_of(2, 7) is None and table.pool.n_free == 4


# --- the planner -------------------------------------------------------------------------
def test_planner_orders_tickets_demand_first_and_batched() -> None:
    posted: list[list[str]] = []
    planner = Planner(threading.Lock(), posted.append)
    with planner.batched():
        planner.submit(["d1"])
        planner.submit(["d2"])
        assert posted == []
    assert posted == [["d1", "d2"]]  # one hand-off
    posted.clear()
    with planner.demand_first():
        planner.submit_prefetch(["p1"])
        planner.submit(["d1"])
    assert posted == [["d1"], ["p1"]]


def test_planner_applies_deferred_work_in_order_once_started() -> None:
    lock = threading.Lock()
    posted: list[list[str]] = []
    planner = Planner(lock, posted.append)
    applied: list[int] = []

    def op(i: int) -> list[str]:
        applied.append(i)
        return [f"t{i}"]

    planner.soon(op, 0)  # not started: at once
    assert applied == [0] and posted == [["t0"]]
    planner.start()
    try:
        with planner.deferred():
            assert planner.defer(op, (1,), key=(1, 5))
            assert planner.defer(op, (2,))
            assert (1, 5) not in planner.queued  # counted when the group is handed over
        end = time.monotonic() + 10
        while len(applied) < 3:
            assert time.monotonic() < end
            time.sleep(0.001)
        with lock:
            planner.drain()
        assert applied == [0, 1, 2] and not planner.queued
        assert not planner.defer(op, (3,))  # outside `deferred()`: the caller applies it
    finally:
        planner.stop()


# --- compute's view of the scheduler -----------------------------------------------------
def test_compute_reaches_the_io_through_acquire_and_prefetch_only() -> None:
    public = {n for n in vars(ExpertSource) if not n.startswith("_")}
    assert public == {"acquire", "prefetch"}
    assert "acquire" not in vars(StepIO) and "prefetch" not in vars(StepIO)
    table = _table()
    fetcher = Fetcher(table, _Tier(), Tracer())  # type: ignore[arg-type]
    source: ExpertSource = Scheduler(table, fetcher, Planner(table.lock, fetcher.post))
    assert source.acquire(1, 0, [5], servable=True) == set()
    # the layers, compute and prefill call no other scheduler method (the step clock,
    # compute/steps.py, drives the step boundaries)
    called = set()
    for room in ("compute", "layers", "prefill"):
        for path in sorted((ROOT / "edge0" / "runtime" / room).glob("*.py")):
            if path.name != "steps.py":
                called |= set(re.findall(r"\bsched(?:uler)?\.(\w+)\(", path.read_text()))
    assert called == {"acquire", "prefetch"}
