"""Route policies' slot helpers on the scheduler: what is servable, keep a set, a bounded read
(docs/runtime.md, "Route policies").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from edge0.runtime.io.slots import SlotState
from edge0.runtime.io.tickets import DEMAND, FetchTicket
from edge0.storage.tier import ExpertKey

if TYPE_CHECKING:
    from edge0.runtime.io.fetcher import Fetcher

    _Base = Fetcher
else:
    _Base = object


class RouteSlots(_Base):
    """`servable`, `staged`, `keep` and `fetch_within` (the route policies call them)."""

    def servable(self, layer: int, experts: list[int]) -> set[int]:
        """Those of `experts` of `layer` compute can have without waiting on storage: ready in
        a slot, or held by the outermost tier's RAM cache (a copy; route policies)."""
        table = self.table
        with self._lock:
            self._drain()
            where = table.where[layer]
            out = {e for e in experts if e in where and table.state(where[e]) is SlotState.READY}
        if hasattr(type(self.tier), "__contains__"):  # a cache tier (tiers/ram.py)
            out |= {e for e in experts if e not in out and ExpertKey(layer, e) in self.tier}  # type: ignore[operator]
        return out

    def staged(self, layer: int, skip: set[int]) -> list[int]:
        """Every expert of `layer` ready in a slot, but those in `skip` (the pool's order)."""
        table = self.table
        with self._lock:
            self._drain()
            return [
                e
                for e, s in table.where[layer].items()
                if e not in skip and table.state(s) is SlotState.READY
            ]

    def keep(self, layer: int, step: int, experts: list[int]) -> int:
        """Reserve `experts` of `layer` for `step` where a slot holds them (so no prefetch
        takes their slots before `acquire`), and copy those the outermost tier caches in RAM
        straight into free slots on the calling compute thread: a record copy instead of a
        trip through the event loop and a worker. Returns how many were copied."""
        table, n = self.table, 0
        copy = getattr(self.tier, "copy_cached", None)
        for e in experts:
            with self._lock:
                self._drain()
                held = e in table.where[layer]
                res = table.reserve(layer, e, step) if held or copy is not None else None
            if res is None or held or copy is None:
                continue
            t0 = time.perf_counter()
            nbytes = copy(ExpertKey(layer, e), self.memory.dest(layer, res.slot))
            if nbytes and self.memory.widened:
                self.memory.widen(res.slot)
            with self._cond:
                if not nbytes:  # evicted since it was asked: `acquire` reads it
                    table.clear(res.slot)
                    continue
                table.mark_ready(res.slot, layer, e)
                self._intervals.append((t0, time.perf_counter()))
                self.stats.bytes += nbytes
                self.stats.hits += 1
                self.stats.by_tier[self.tier.name] = self.stats.by_tier.get(self.tier.name, 0) + 1
                n += 1
        return n

    def fetch_within(self, layer: int, step: int, experts: list[int], timeout_s: float) -> set[int]:
        """Read `experts` of `layer` for `step` (demand) and wait at most `timeout_s`; return
        those ready by then. The others go on loading (used later if still staged) or are
        released by `acquire`; an expert without a free slot is not waited for."""
        table, end = self.table, time.perf_counter() + timeout_s
        with self._cond:
            self._drain()
            slots: dict[int, int] = {}
            new: list[FetchTicket] = []
            for e in experts:
                got = self._issue(layer, step, e, DEMAND)
                if got is not None:
                    slots[e] = got[0]
                    new += [got[1]] if got[1] is not None else []
            self._submit(new)
            while True:
                loading = [s for s in slots.values() if table.state(s) is SlotState.LOADING]
                left = end - time.perf_counter()
                if not loading or left <= 0 or self._closed:
                    break
                self._cond.wait(left)
            return {e for e, s in slots.items() if table.state(s) is SlotState.READY}
