"""The slot table: which expert sits in which slot of a streamed layer; when slots may be rewritten.

Pure and synchronous (no MLX, no I/O, no awaits): the scheduler changes slot state
here under its lock, then does the waiting and reading elsewhere.

Each streamed MoE layer has `n_slots` = 2K slots (K = routing capacity): room for
the experts of the step being computed and of the next step, which is being
prefetched. A slot remembers the last step whose compute may read it
(`last_step`). The fence rule: a slot may be rewritten for a new expert only when
`last_step < now`, where `now` is the step being computed; every graph of steps
before `now` was evaluated at the step boundary, so nothing pending reads it.
An expert already staged stays where it is (incremental table); only misses are
written, and each write is counted as a rewrite.
"""

from __future__ import annotations

import enum

import attrs


class SlotState(enum.Enum):
    EMPTY = "empty"
    LOADING = "loading"  # a read into this slot is queued or in flight
    READY = "ready"
    FAILED = "failed"  # the read failed; the error is kept by the scheduler


@attrs.define
class Slot:
    expert: int = -1
    state: SlotState = SlotState.EMPTY
    last_step: int = -1  # last step whose compute may read this slot
    touched: int = 0  # LRU clock value of the last reservation


@attrs.frozen
class Reservation:
    """Where an expert will be for a step, and whether its bytes must be read."""

    slot: int
    needs_read: bool


class LayerSlots:
    """Slot bookkeeping of one streamed MoE layer."""

    def __init__(self, n_slots: int) -> None:
        if n_slots < 1:
            raise ValueError(f"a layer needs at least one slot, got {n_slots}")
        self.slots = [Slot() for _ in range(n_slots)]
        self.where: dict[int, int] = {}  # expert -> slot
        self.rewrites = 0
        self._clock = 0

    @property
    def n_slots(self) -> int:
        return len(self.slots)

    def slot_of(self, expert: int) -> int | None:
        return self.where.get(expert)

    def reserve(self, expert: int, step: int, now: int) -> Reservation | None:
        """Keep `expert` in a slot readable at `step`; None when no slot is free yet.

        Args:
            expert: the expert index.
            step: the step whose compute will read the slot (now or now + 1).
            now: the step being computed (slots with last_step < now are free).
        """
        self._clock += 1
        s = self.where.get(expert)
        if s is not None:
            slot = self.slots[s]
            slot.last_step = max(slot.last_step, step)
            slot.touched = self._clock
            return Reservation(s, needs_read=False)
        s = self._free_slot(now)
        if s is None:
            return None
        slot = self.slots[s]
        if slot.expert >= 0:
            del self.where[slot.expert]
        self.rewrites += 1
        self.slots[s] = Slot(expert, SlotState.LOADING, step, self._clock)
        self.where[expert] = s
        return Reservation(s, needs_read=True)

    def _free_slot(self, now: int) -> int | None:
        best, best_key = None, None
        for i, slot in enumerate(self.slots):
            if slot.state is SlotState.LOADING or slot.last_step >= now:
                continue
            key = (slot.state is not SlotState.EMPTY, slot.touched)  # empty first, then LRU
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best

    def release(self, expert: int, step: int) -> None:
        """`expert` will not be read at `step` after all (a prediction that missed)."""
        s = self.where.get(expert)
        if s is not None and self.slots[s].last_step == step:
            self.slots[s].last_step = step - 1

    def mark_ready(self, slot: int, expert: int) -> None:
        if self.slots[slot].expert == expert:
            self.slots[slot].state = SlotState.READY

    def mark_failed(self, slot: int, expert: int) -> None:
        if self.slots[slot].expert == expert:
            self.slots[slot].state = SlotState.FAILED

    def clear(self, slot: int) -> None:
        """Forget the slot's content (a cancelled read or a failure being reset)."""
        old = self.slots[slot]
        if old.expert >= 0 and self.where.get(old.expert) == slot:
            del self.where[old.expert]
        self.slots[slot] = Slot(touched=old.touched)

    def clear_failed(self) -> None:
        for i, slot in enumerate(self.slots):
            if slot.state is SlotState.FAILED:
                self.clear(i)

    def state(self, slot: int) -> SlotState:
        return self.slots[slot].state


class SlotTable:
    """All streamed layers' slot bookkeeping, keyed by model layer index."""

    def __init__(self, layers: list[int], n_slots: int) -> None:
        self.layers = {layer: LayerSlots(n_slots) for layer in layers}

    def __getitem__(self, layer: int) -> LayerSlots:
        return self.layers[layer]

    @property
    def rewrites(self) -> int:
        return sum(t.rewrites for t in self.layers.values())

    def clear_failed(self) -> None:
        for t in self.layers.values():
            t.clear_failed()
