"""The planner thread: deferred slot-table work applied in order, on its thread or the caller's."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PROMPT, build_store

from edge0.runtime.engine.api import Engine
from edge0.runtime.io.planner import Planner


def _planner() -> tuple[Planner, threading.Lock, list[list[Any]], list[tuple[str, int]]]:
    lock = threading.Lock()
    posted: list[list[Any]] = []
    done: list[tuple[str, int]] = []
    planner = Planner(lock, posted.append)
    planner.start()
    return planner, lock, posted, done


def _op(done: list[tuple[str, int]], i: int) -> tuple[Any, tuple[Any, ...]]:
    def apply(i: int) -> list[Any]:
        done.append((threading.current_thread().name, i))
        return [f"ticket{i}"]

    return apply, (i,)


def _wait(cond: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "the planner thread did not apply the queued ops"
        time.sleep(0.001)


def test_queued_ops_run_on_the_planner_thread_in_order() -> None:
    planner, _, posted, done = _planner()
    try:
        planner.put([_op(done, i) for i in range(5)])
        _wait(lambda: len(done) == 5)
        assert done == [("edge0-planner", i) for i in range(5)]
        _wait(lambda: planner.applied_here == 5)
        assert [t for batch in posted for t in batch] == [f"ticket{i}" for i in range(5)]
    finally:
        planner.stop()


def test_drain_applies_what_is_queued_on_the_caller() -> None:
    planner, lock, posted, done = _planner()
    try:
        planner.put([_op(done, i) for i in range(3)], wake=False)  # the thread is not woken
        time.sleep(0.05)
        assert done == []
        with lock:
            planner.drain()
        me = threading.current_thread().name
        assert done == [(me, 0), (me, 1), (me, 2)]
        assert posted == [["ticket0", "ticket1", "ticket2"]]  # one hand-off for the batch
        assert planner.applied == 3 and planner.applied_here == 0
    finally:
        planner.stop()


def test_a_failed_op_is_raised_by_the_next_drain_and_its_batch_is_still_read() -> None:
    planner, lock, posted, done = _planner()

    def boom() -> list[Any]:
        raise ValueError("bad op")

    try:
        planner.put([_op(done, 0), (boom, ()), _op(done, 1)])
        _wait(lambda: planner.applied == 1 and posted)
        assert posted[0] == ["ticket0"]  # what was applied before the failure is read
        with lock, pytest.raises(ValueError, match="bad op"):
            planner.drain()
        with lock:
            planner.drain()  # the op after the failed one is still applied
        assert [i for _, i in done] == [0, 1]
    finally:
        planner.stop()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("planner"), "qwen3_5_moe", layers=8)


async def _decode(path: Path, **opts: Any) -> tuple[list[int], Any, int, int]:
    async with Engine.open(path, tiers="pread", predictor="init", **opts) as eng:
        toks = [t async for t in eng.tokens(PROMPT, max_tokens=12, stop=False)]
        planner = eng.setup.scheduler.planner
        return toks, eng.last_stats, planner.applied, planner.applied_here


def test_grouped_route_defers_its_bookkeeping_and_decodes_the_same_tokens(store: Path) -> None:
    # per layer at once (only the step expiry and consumption marks deferred)
    ref, _, applied1, _ = asyncio.run(_decode(store, mode="route", sync_every=1))
    toks, stats, applied4, _ = asyncio.run(_decode(store, mode="route", sync_every=4))
    assert toks == ref
    # grouped, each group's fence move and each layer's prefetch go through the planner too:
    # 8 layers, 11 decode steps of which 10 prefetch (the last has no next step)
    assert applied4 - applied1 >= 10 * 8
    # deferred consumption is counted before the request's stats are taken
    assert stats.tickets_wasted == 0 and stats.tickets_consumed == stats.tickets_issued > 0
