"""The slot table: incremental staging, the step fence, capacity 2K, release and failure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge0.runtime.slots import LayerSlots, SlotState


def test_staged_expert_stays_put_and_is_not_reread() -> None:
    t = LayerSlots(4)
    a = t.reserve(7, step=0, now=0)
    assert a is not None and a.needs_read
    t.mark_ready(a.slot, 7)
    b = t.reserve(7, step=1, now=1)
    assert b is not None and b.slot == a.slot and not b.needs_read
    assert t.rewrites == 1


def test_fence_protects_slots_of_current_and_next_step() -> None:
    t = LayerSlots(2)
    for e in (1, 2):
        r = t.reserve(e, step=5, now=5)
        assert r is not None
        t.mark_ready(r.slot, e)
    # both slots may still be read by step 5's pending graph: no slot for a new expert
    assert t.reserve(3, step=6, now=5) is None
    # once step 6 is being computed, step-5 slots are free again (LRU one first)
    r = t.reserve(3, step=6, now=6)
    assert r is not None and r.needs_read and t.slot_of(1) is None


def test_loading_slot_is_never_chosen_for_another_expert() -> None:
    t = LayerSlots(1)
    r = t.reserve(1, step=0, now=0)
    assert r is not None
    assert t.reserve(2, step=1, now=5) is None  # still loading
    t.mark_ready(r.slot, 1)
    assert t.reserve(2, step=6, now=6) is not None


def test_release_frees_a_wrong_prediction() -> None:
    t = LayerSlots(2)
    for e in (1, 2):
        r = t.reserve(e, step=3, now=2)
        assert r is not None
        t.mark_ready(r.slot, e)
    assert t.reserve(9, step=3, now=3) is None
    t.release(2, step=3)
    r = t.reserve(9, step=3, now=3)
    assert r is not None and r.slot == 1 and t.slot_of(2) is None


def test_failed_slot_is_cleared_on_reset() -> None:
    t = LayerSlots(2)
    r = t.reserve(4, step=0, now=0)
    assert r is not None
    t.mark_failed(r.slot, 4)
    assert t.state(r.slot) is SlotState.FAILED
    t.clear_failed()
    assert t.slot_of(4) is None and t.state(r.slot) is SlotState.EMPTY


def test_zero_slots_is_an_error() -> None:
    with pytest.raises(ValueError):
        LayerSlots(0)


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 4),
    n_experts=st.integers(4, 12),
    data=st.data(),
)
def test_two_k_slots_always_hold_this_step_and_the_next(k: int, n_experts: int, data) -> None:
    """Per step: prefetch up to K for step+1, then compute needs up to K (release what missed)."""
    t = LayerSlots(2 * k)
    experts = st.lists(st.integers(0, n_experts - 1), min_size=1, max_size=k, unique=True)
    pending: set[int] = set()
    for step in range(12):
        needed = data.draw(experts)
        for e, s in list(t.where.items()):
            if e not in needed and t.slots[s].last_step == step:
                t.release(e, step)
        slots = []
        for e in needed:
            r = t.reserve(e, step, now=step)
            assert r is not None, "2K slots must always fit the current step"
            slots.append(r.slot)
            t.mark_ready(r.slot, e)
        assert len(set(slots)) == len(slots)
        # slots compute reads at this step hold exactly the needed experts
        assert [t.slots[s].expert for s in slots] == needed
        predicted = data.draw(experts)
        for e in predicted:
            r = t.reserve(e, step + 1, now=step)
            assert r is not None, "2K slots must fit the next step's prefetch"
            assert r.slot not in slots or t.slots[r.slot].expert == e
            t.mark_ready(r.slot, e)
        pending = set(predicted)
    assert pending
