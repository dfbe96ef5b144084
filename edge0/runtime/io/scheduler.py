"""The scheduler: compute's side of the slot table: step boundaries, slot claims, the fence
(docs/runtime.md, "Threads" and "Slot memory and the slot pool").
"""

from __future__ import annotations

from typing import Any

from edge0.errors import Edge0Error, TierReadError
from edge0.runtime.io.fetcher import Fetcher, ReadStats
from edge0.runtime.io.route_slots import RouteSlots
from edge0.runtime.io.slots import SlotState
from edge0.runtime.io.tickets import DEMAND, FetchTicket

__all__ = ["FenceNeeded", "ReadStats", "Scheduler"]


class FenceNeeded(Exception):
    """acquire found the pool full of slots that unevaluated graphs may still read."""


class Scheduler(RouteSlots, Fetcher):
    """Issues fetch tickets, runs their reads, and hands compute its slots."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        # layer -> (experts, slots, table.steals when claimed): this step's claimed layers
        self._claims: dict[int, tuple[list[int], list[int], int]] = {}
        order = sorted(self.order, key=self.order.__getitem__)
        self._later = {layer: order[i:] for i, layer in enumerate(order)}

    # --- compute thread side ------------------------------------------------------------
    def begin_request(self, request: int) -> None:
        """A new request. After failed reads, the reads still queued are cancelled and those
        in flight are waited for first, so that none of them fails a slot after the failures
        were forgotten (a failed request leaves the engine serving the next one)."""
        with self._cond:
            self._drain()
            if self._errors:  # (only then: in a batch the other requests' reads go on)
                for t in self._loader.values():
                    if t.outcome == "queued":
                        t.outcome = "cancelled"
                        self.table.clear(t.slot)
                        self.stats.cancelled += 1
                while self._in_flight and not self._closed:
                    self._cond.wait()
            self.request = request
            self.table.clear_failed()
            self._errors.clear()
            self._ahead.clear()
            self._planned.clear()
            self._claims.clear()
            self._intervals.clear()  # read spans of earlier requests: io_time never asks again

    def forget_failures(self) -> None:
        """Failed reads are forgotten (a batch ended the requests that needed them)."""
        with self._lock:
            self._drain()
            self.table.clear_failed()
            self._errors.clear()

    def begin_step(self, step: int) -> None:
        """Compute starts `step`: every graph of earlier steps has been evaluated (the fence)."""
        with self._lock:
            self.now = step
            self._claims.clear()
            self._soon(self._past, step)

    def _past(self, step: int) -> list[FetchTicket]:
        """Step `step` began (lock held): earlier steps' graphs ran, their predictions expire."""
        self.table.advance(step - 1)
        for key in [k for k in self._ahead if k[1] < step]:
            del self._ahead[key]  # predicted for a step that has passed
            self._planned.pop(key, None)
        return []

    def evaluated(self, step: int, layer: int) -> None:
        """Compute evaluated every graph of `step` before `layer` (their slots may be reused)."""
        if self._deferring is not None:  # inside `deferred()`: the planner moves it
            self._deferring.append((self._advance, (step, layer)))
            return
        with self._lock:  # (nobody waits for this: compute itself is the only waiter)
            self._drain()
            self._advance(step, layer)

    def _advance(self, step: int, layer: int) -> list[FetchTicket]:
        order = self.order.get(layer)
        if order is not None:
            self.table.advance(step, order - 1)
        return []

    def acquire(self, layer: int, step: int, experts: list[int], fenced: bool = True) -> list[int]:
        """Slots holding `experts` of `layer`, ready for `step`; blocks until they are.

        `fenced`: compute evaluated the graph that produced this layer's input, so every
        earlier layer of `step` is done with its slots (they may be rewritten). Without
        it (route mode's deferred syncs) the fence stays where `evaluated` put it, and a
        full pool raises `FenceNeeded` so compute can evaluate and ask again.
        """
        slots, done = self.stage(layer, step, experts, fenced)
        if done:
            return slots
        table = self.table
        with self._cond:
            while any(table.state(s) is SlotState.LOADING for s in slots):
                self._wait()
            for s, e in zip(slots, experts, strict=True):
                self._check(layer, s, e)
            self._consume(layer, slots, experts, step)
        return slots

    def arrived(
        self, layer: int, step: int, experts: list[int], slots: list[int], pending: list[int]
    ) -> list[int]:
        """The positions in `pending` (indices into `experts` and their `slots`, from
        `stage`) whose reads are done, once at least one is (blocks); compute reads them
        now. A failed read raises its error."""
        table = self.table
        with self._cond:
            while True:
                done = [i for i in pending if table.state(slots[i]) is not SlotState.LOADING]
                if done:
                    break
                self._wait()
            for i in done:
                self._check(layer, slots[i], experts[i])
            self._consume(layer, [slots[i] for i in done], [experts[i] for i in done], step)
        return done

    def _check(self, layer: int, slot: int, expert: int) -> None:
        """A read compute waited for: its slot is ready, or its error is raised (lock held)."""
        if self.table.state(slot) is not SlotState.READY:
            raise self._errors.get((layer, slot)) or TierReadError(
                "slot lost its record", layer=layer, expert=expert
            )

    def stage(
        self, layer: int, step: int, experts: list[int], fenced: bool = True
    ) -> tuple[list[int], bool]:
        """`acquire` without its wait: the slots of `experts`, reads issued at once for those
        not staged, and whether every one is ready and consumed already (else `arrived`
        tells which are, as their reads complete). Blocks only for a free slot."""
        table = self.table
        with self._cond:
            if (layer, step) in self._queued:  # its prefetch is not applied yet: apply it
                self._drain()
            if fenced:
                table.advance(step, table.order[layer] - 1)
            claim = self._claims.pop(layer, None)
            if claim is None and (layer, step) in self._planned:
                self._claim_step(step, layer)  # this and every later layer staged by now
                claim = self._claims.pop(layer, None)
            if claim is not None and claim[2] == table.steals and claim[0] == experts:
                self._ahead.pop((layer, step), None)
                self._planned.pop((layer, step), None)
                self.stats.staged_hits += len(experts)
                self._soon(self._consume, layer, claim[1], experts, step)
                return claim[1], True
            self._drain()  # the slow path: every deferred fence move and reservation first
            self._release_unneeded(layer, step, experts)
            staged = table.claim(layer, experts, step)
            if staged is not None:  # every expert staged and ready: no ticket, no wait
                self.stats.staged_hits += len(experts)
                self._soon(self._consume, layer, staged, experts, step)
                return staged, True
            slots: list[int] = []
            new: list[FetchTicket] = []
            for e in experts:
                got = self._issue(layer, step, e, DEMAND)
                while got is None:  # no free slot: take back a later prefetch, or wait for one
                    if table.steal(step, layer) is None:
                        if not table.any_loading():
                            self._submit(new)
                            if not fenced:  # slots wait on unevaluated graphs: evaluate first
                                self.stats.fences += 1
                                raise FenceNeeded(layer)
                            raise RuntimeError(f"slot pool is over capacity at layer {layer}")
                        self._submit(new)
                        new = []
                        self._post_after()  # (a held prefetch may be what frees a slot)
                        self._wait()
                    got = self._issue(layer, step, e, DEMAND)
                slots.append(got[0])
                if got[1] is not None:
                    new.append(got[1])
            self._submit(new)
            self.stats.staged_misses += len(new)
            self.stats.staged_hits += len(experts) - len(new)
        return slots, False

    def _claim_step(self, step: int, first: int) -> None:
        """Claim, in one pass, the slots of `first` and of every later layer whose one
        prefetched set for `step` is staged and ready (no read, no wait): their acquire
        then only checks that the set asked is that set and that no slot was stolen since.
        Only a steal takes a claimed slot (its reader, this step's layer, is not evaluated)."""
        table, planned, claims = self.table, self._planned, self._claims
        for layer in self._later[first]:
            experts = planned.get((layer, step))
            if experts is None or layer in claims:
                continue
            slots = table.claim(layer, experts, step)
            if slots is not None:
                claims[layer] = (experts, slots, table.steals)

    def _consume(self, layer: int, slots: list[int], experts: list[int], step: int) -> list[Any]:
        """Compute reads these slots at `step`: the tickets that filled them were used (lock
        held; later tickets into the same slots are not these)."""
        loader = self._loader
        for s, e in zip(slots, experts, strict=True):
            t = loader.get((layer, s))
            if t is not None and not t.consumed and t.expert == e and t.step <= step:
                t.consumed = True
                self.stats.consumed += 1
        return []

    def _wait(self) -> None:
        if self._closed:
            raise Edge0Error("the engine closed while compute waited for expert reads")
        self._cond.wait()

    def _release_unneeded(self, layer: int, step: int, needed: list[int]) -> None:
        """Predicted experts that compute will not read at `step`: free them (cancel if queued).

        Only a prefetch for (`layer`, `step`) gives a slot that reader before this acquire.
        """
        ahead = self._ahead.pop((layer, step), None)
        self._planned.pop((layer, step), None)
        if not ahead:
            return
        table = self.table
        for e in ahead.difference(needed):
            s = table.where[layer].get(e)
            if s is None or not table.reserved_for(s, step):
                continue
            table.release(layer, e, step)
            t = self._loader.get((layer, s))
            if t is not None and t.outcome == "queued":
                t.outcome = "cancelled"
                self.stats.cancelled += 1
                table.clear(s)
