"""The slot table: the slot pool and its memory, the failed reads of its slots, and the lock that
guards them (docs/runtime.md, "The I/O room")."""

from __future__ import annotations

import threading

from edge0.errors import Edge0Error, TierReadError
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.slots import SlotPool, SlotState


class SlotTable:
    """`pool` and `memory` under one lock; `cond` wakes those who wait for a slot's read."""

    def __init__(self, pool: SlotPool, memory: SlotMemory) -> None:
        self.pool = pool
        self.memory = memory
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.errors: dict[tuple[int, int], BaseException] = {}  # (layer, slot) -> its failure
        self.closed = False  # the engine closed: waiting raises

    def wait(self) -> None:
        """Wait for the next read outcome (lock held); raises once the engine is closed."""
        if self.closed:
            raise Edge0Error("the engine closed while compute waited for expert reads")
        self.cond.wait()

    def close(self) -> None:
        """The engine closed (lock held): whoever waits for a read, or will, raises."""
        self.closed = True
        self.cond.notify_all()

    def check(self, layer: int, slot: int, expert: int) -> None:
        """A read compute waited for: its slot is ready, or its error is raised (lock held)."""
        if self.pool.state(slot) is not SlotState.READY:
            raise self.errors.get((layer, slot)) or TierReadError(
                "slot lost its record", layer=layer, expert=expert
            )

    def fail(self, slot: int, layer: int, expert: int, error: BaseException) -> None:
        """A read into `slot` failed (lock held): compute waiting for it raises `error`."""
        self.pool.mark_failed(slot, layer, expert)
        self.errors[(layer, slot)] = error

    def forget_failures(self) -> None:
        """Failed slots are emptied and their errors forgotten (lock held)."""
        self.pool.clear_failed()
        self.errors.clear()

    def ready(self, layer: int, experts: list[int]) -> set[int]:
        """Those of `experts` of `layer` ready in a slot (lock held)."""
        pool = self.pool
        where = pool.where[layer]
        return {e for e in experts if e in where and pool.state(where[e]) is SlotState.READY}

    def staged(self, layer: int, skip: set[int]) -> list[int]:
        """Every expert of `layer` ready in a slot, but those in `skip`, in the pool's order
        (lock held)."""
        pool = self.pool
        return [
            e
            for e, s in pool.where[layer].items()
            if e not in skip and pool.state(s) is SlotState.READY
        ]
