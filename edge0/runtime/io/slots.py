"""The slot pool: which (layer, expert) sits in which shared slot, and when a slot may be rewritten;
pure and synchronous (docs/runtime.md, "Slot memory and the slot pool").
"""

from __future__ import annotations

import collections
import enum
import heapq

import attrs

INF = 1 << 30
Tag = tuple[int, int]  # (step, layer order)


class SlotState(enum.Enum):
    EMPTY = "empty"
    LOADING = "loading"  # a read into this slot is queued or in flight
    READY = "ready"
    FAILED = "failed"  # the read failed; the error is kept by the scheduler


@attrs.define
class Slot:
    layer: int = -1
    expert: int = -1
    state: SlotState = SlotState.EMPTY
    reader: Tag = (-1, -1)  # last (step, layer order) whose compute may read this slot


@attrs.frozen
class Reservation:
    """Where an expert will be for a step, and whether its bytes must be read."""

    slot: int
    needs_read: bool


class SlotPool:
    """Slot bookkeeping of all streamed layers (model layer indices, in compute order)."""

    def __init__(self, layers: list[int], n_slots: int) -> None:
        if n_slots < 1:
            raise ValueError(f"the slot pool needs at least one slot, got {n_slots}")
        self.order = {layer: i for i, layer in enumerate(layers)}
        self.slots = [Slot() for _ in range(n_slots)]
        self.where: dict[int, dict[int, int]] = {layer: {} for layer in layers}  # expert -> slot
        self.rewrites = 0
        self.steals = 0  # prefetched slots taken back for a layer being computed
        self.evaluated: Tag = (-1, INF)  # every graph up to this (step, order) has run
        self._free: collections.OrderedDict[int, None] = collections.OrderedDict(
            (s, None) for s in range(n_slots)
        )  # rewritable slots, oldest first
        self._readers: dict[Tag, set[int]] = {}  # reader not yet evaluated -> slots
        self._tags: list[Tag] = []  # heap of the keys of _readers
        self._held: set[int] = set()  # reader evaluated but a read is still in flight

    @property
    def layers(self) -> dict[int, dict[int, int]]:
        return self.where

    @property
    def n_slots(self) -> int:
        return len(self.slots)

    @property
    def n_free(self) -> int:
        return len(self._free)

    def slot_of(self, layer: int, expert: int) -> int | None:
        return self.where[layer].get(expert)

    def state(self, slot: int) -> SlotState:
        return self.slots[slot].state

    def any_loading(self) -> bool:
        return any(s.state is SlotState.LOADING for s in self.slots)

    # --- the fence ------------------------------------------------------------------------
    def advance(self, step: int, order: int = INF) -> None:
        """Compute evaluated every graph of steps before `step`, and of `step` up to `order`."""
        tag = (step, order)
        if tag <= self.evaluated:
            return
        self.evaluated = tag
        tags, readers, slots = self._tags, self._readers, self.slots
        free, held, loading = self._free, self._held, SlotState.LOADING
        while tags and tags[0] <= tag:
            for s in readers.pop(heapq.heappop(tags)):  # `_settle`, inlined: the hot loop
                if slots[s].state is loading:
                    held.add(s)
                else:
                    free[s] = None

    def _settle(self, s: int) -> None:
        """File slot `s` (whose reader is evaluated) as free, or held while it loads."""
        if self.slots[s].state is SlotState.LOADING:
            self._held.add(s)
        else:
            self._free[s] = None

    def _unfile(self, s: int) -> None:
        reader = self.slots[s].reader
        if reader > self.evaluated:
            self._readers[reader].discard(s)
        else:
            self._free.pop(s, None)
            self._held.discard(s)

    def _file(self, s: int, reader: Tag) -> None:
        self.slots[s].reader = reader
        if reader > self.evaluated:
            if reader not in self._readers:
                self._readers[reader] = set()
                heapq.heappush(self._tags, reader)
            self._readers[reader].add(s)
        else:
            self._settle(s)

    # --- reservations ---------------------------------------------------------------------
    def reserve(self, layer: int, expert: int, step: int) -> Reservation | None:
        """Keep `expert` of `layer` in a slot readable at `step`; None when no slot is free."""
        tag = (step, self.order[layer])
        s = self.where[layer].get(expert)
        if s is not None:
            reader = max(self.slots[s].reader, tag)
            self._unfile(s)
            self._file(s, reader)
            return Reservation(s, needs_read=False)
        if not self._free:
            return None
        s, _ = self._free.popitem(last=False)
        self._forget(s)
        self.rewrites += 1
        self.slots[s] = Slot(layer, expert, SlotState.LOADING)
        self.where[layer][expert] = s
        self._file(s, tag)
        return Reservation(s, needs_read=True)

    def claim(self, layer: int, experts: list[int], step: int) -> list[int] | None:
        """The slots of `experts` for compute of `layer` at `step` when every one is staged and
        ready (what `reserve` would give, without a read); None: some are not (reserve them)."""
        tag = (step, self.order[layer])
        where, slots = self.where[layer], self.slots
        got = []
        for e in experts:
            s = where.get(e)
            if s is None or slots[s].state is not SlotState.READY:
                return None
            if slots[s].reader != tag:
                self.reserve(layer, e, step)
            got.append(s)
        return got

    def _forget(self, s: int) -> None:
        old = self.slots[s]
        if old.layer >= 0 and self.where[old.layer].get(old.expert) == s:
            del self.where[old.layer][old.expert]

    def reserved_for(self, slot: int, step: int) -> bool:
        """Whether compute at `step` (of the slot's layer) is the slot's last reader."""
        s = self.slots[slot]
        return s.reader == (step, self.order[s.layer])

    def release(self, layer: int, expert: int, step: int) -> None:
        """`expert` will not be read at `step` after all (a prediction that missed)."""
        s = self.where[layer].get(expert)
        if s is not None and self.reserved_for(s, step):
            self._unfile(s)
            self._file(s, (step - 1, INF))  # its earlier readers ran before `step` began

    def steal(self, step: int, layer: int) -> int | None:
        """Free the staged slot needed latest by another layer (for compute of `layer` now).

        Only a ready slot whose reader comes after `layer` at `step`, and that no
        pending graph reads: its expert will be read again when its layer needs it.
        """
        cur = self.order[layer]
        lo = self.evaluated[1] if self.evaluated[0] == step else -1
        for tag in sorted(self._readers, reverse=True):
            if tag <= (step, cur):
                break
            for s in sorted(self._readers[tag]):
                slot = self.slots[s]
                pending = lo < self.order[slot.layer] <= cur  # used at `step`, not yet evaluated
                if slot.state is SlotState.READY and not pending:
                    self._unfile(s)
                    self._forget(s)
                    self.slots[s] = Slot()
                    self._file(s, (-1, -1))
                    self._free.move_to_end(s, last=False)
                    self.steals += 1
                    return s
        return None

    # --- read outcomes --------------------------------------------------------------------
    def _is(self, slot: int, layer: int, expert: int) -> bool:
        s = self.slots[slot]
        return s.layer == layer and s.expert == expert

    def mark_ready(self, slot: int, layer: int, expert: int) -> None:
        if self._is(slot, layer, expert):
            self.slots[slot].state = SlotState.READY
            if slot in self._held:
                self._held.discard(slot)
                self._free[slot] = None

    def mark_failed(self, slot: int, layer: int, expert: int) -> None:
        if self._is(slot, layer, expert):
            self.slots[slot].state = SlotState.FAILED
            if slot in self._held:
                self._held.discard(slot)
                self._free[slot] = None

    def clear(self, slot: int) -> None:
        """Forget the content (a cancelled read, a failure being reset); rewritten first."""
        self._unfile(slot)
        self._forget(slot)
        self.slots[slot] = Slot()
        self._file(slot, (-1, -1))
        self._free.move_to_end(slot, last=False)

    def clear_failed(self) -> None:
        for i, slot in enumerate(self.slots):
            if slot.state is SlotState.FAILED:
                self.clear(i)


def pool_size(top_k: int, layers: int, slack: int = 2, extra: int = 0) -> int:
    """Slots for `layers` streamed layers at routing capacity `top_k`: K x (L + slack) + extra.

    In flight at any moment: the experts of this step's layers not yet computed and
    of the next step's layers already predicted (about K per layer), the layer being
    computed and the one whose graph is still pending. `slack` = 2 covers those with
    one evaluation per layer; a compute path that leaves G layers' graphs pending
    needs G + 1. Never fewer than 2K (one layer's current and next sets).
    """
    return max(2 * top_k, top_k * (layers + slack)) + extra
