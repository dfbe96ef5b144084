"""The route policies' reads, as `acquire` and `prefetch` options: what is servable now, reads
bounded by a deadline, a chosen set held (docs/runtime.md, "Route policies")."""

from __future__ import annotations

import time

from edge0.runtime.io.fetcher import Fetcher
from edge0.runtime.io.planner import Planner
from edge0.runtime.io.slots import SlotState
from edge0.runtime.io.table import SlotTable
from edge0.runtime.io.tickets import DEMAND, FetchTicket


def servable(
    table: SlotTable, fetcher: Fetcher, planner: Planner, layer: int, experts: list[int]
) -> set[int]:
    """Those of `experts` of `layer` compute can have without waiting on storage: ready in a
    slot, or held by the outermost tier's RAM cache (a copy)."""
    with table.lock:
        planner.drain()
        out = table.ready(layer, experts)
    return out | fetcher.cached(layer, [e for e in experts if e not in out])


def staged(table: SlotTable, planner: Planner, layer: int, skip: set[int]) -> list[int]:
    """Every expert of `layer` ready in a slot, but those in `skip` (the pool's order)."""
    with table.lock:
        planner.drain()
        return table.staged(layer, skip)


def keep(
    table: SlotTable, fetcher: Fetcher, planner: Planner, layer: int, step: int, experts: list[int]
) -> int:
    """Hold the slots of `experts` of `layer` for `step`; copy those the RAM cache holds into
    free slots on this thread (`Fetcher.copy_cached`). Returns how many were copied."""
    with table.lock:
        planner.drain()
    return fetcher.copy_cached(layer, step, experts)


def within(
    table: SlotTable,
    fetcher: Fetcher,
    planner: Planner,
    request: int,
    layer: int,
    step: int,
    experts: list[int],
    timeout_s: float,
) -> set[int]:
    """Read `experts` of `layer` for `step` (demand) and wait at most `timeout_s`; return those
    ready by then. The others go on loading (used later if still staged) or are released by
    `acquire`; an expert without a free slot is not waited for."""
    pool, end = table.pool, time.perf_counter() + timeout_s
    with table.cond:
        planner.drain()
        slots: dict[int, int] = {}
        new: list[FetchTicket] = []
        for e in experts:
            got = fetcher.issue(request, layer, step, e, DEMAND)
            if got is not None:
                slots[e] = got[0]
                new += [got[1]] if got[1] is not None else []
        planner.submit(new)
        while True:
            loading = [s for s in slots.values() if pool.state(s) is SlotState.LOADING]
            left = end - time.perf_counter()
            if not loading or left <= 0 or table.closed:
                break
            table.cond.wait(left)
        return {e for e, s in slots.items() if pool.state(s) is SlotState.READY}
