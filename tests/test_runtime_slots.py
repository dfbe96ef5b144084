"""The slot pool: incremental staging, the fence across layers, release, steal, failure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge0.runtime.io.slots import SlotPool, SlotState, pool_size


def _ready(t: SlotPool, layer: int, expert: int, step: int) -> int:
    r = t.reserve(layer, expert, step)
    assert r is not None
    t.mark_ready(r.slot, layer, expert)
    return r.slot


def test_staged_expert_stays_put_and_is_not_reread() -> None:
    t = SlotPool([0], 4)
    a = t.reserve(0, 7, step=0)
    assert a is not None and a.needs_read
    t.mark_ready(a.slot, 0, 7)
    t.advance(0)
    b = t.reserve(0, 7, step=1)
    assert b is not None and b.slot == a.slot and not b.needs_read
    assert t.rewrites == 1


def test_fence_protects_slots_until_their_reader_is_evaluated() -> None:
    t = SlotPool([3, 5], 2)
    _ready(t, 3, 1, step=5)
    _ready(t, 5, 2, step=5)
    t.advance(4)  # step 5 is being computed
    assert t.reserve(3, 9, step=6) is None  # both slots may be read by step 5's graphs
    t.advance(5, 0)  # layer 3 (order 0) of step 5 has been evaluated: its slot serves any layer
    r = t.reserve(5, 9, step=6)
    assert r is not None and r.needs_read and t.slot_of(3, 1) is None
    assert t.reserve(3, 4, step=6) is None  # layer 5's slot is still read at step 5
    t.advance(5)
    assert t.reserve(3, 4, step=6) is not None


def test_a_slot_used_again_next_step_keeps_its_later_reader() -> None:
    t = SlotPool([0, 1], 2)
    s = _ready(t, 1, 4, step=0)
    assert t.reserve(1, 4, step=1) == t.reserve(1, 4, step=0)  # predicted again, then acquired
    t.advance(0)
    assert t.reserve(0, 8, step=1) is not None  # the one empty slot
    assert t.reserve(0, 9, step=1) is None  # slot `s` is read at step 1
    assert t.slots[s].reader == (1, 1)


def test_loading_slot_is_never_chosen_for_another_expert() -> None:
    t = SlotPool([0], 1)
    r = t.reserve(0, 1, step=0)
    assert r is not None
    t.advance(5)
    assert t.reserve(0, 2, step=6) is None  # still loading
    t.mark_ready(r.slot, 0, 1)
    assert t.reserve(0, 2, step=6) is not None


def test_free_slots_keep_their_expert_and_are_rewritten_in_release_order() -> None:
    t = SlotPool([0, 1], 3)
    a = _ready(t, 0, 1, step=0)
    b = _ready(t, 1, 2, step=0)
    t.advance(0)
    hit = t.reserve(1, 2, step=1)  # still there: no read
    assert hit is not None and hit.slot == b and not hit.needs_read
    r1 = t.reserve(0, 7, step=1)  # the empty slot first
    r2 = t.reserve(0, 8, step=1)  # then the oldest free one
    assert r1 is not None and r2 is not None and r2.slot == a and t.slot_of(0, 1) is None


def test_release_frees_a_wrong_prediction() -> None:
    t = SlotPool([0], 2)
    for e in (1, 2):
        _ready(t, 0, e, step=3)
    t.advance(2)
    assert t.reserve(0, 9, step=3) is None
    t.release(0, 2, step=3)
    r = t.reserve(0, 9, step=3)
    assert r is not None and r.slot == 1 and t.slot_of(0, 2) is None


def test_steal_takes_a_later_prefetch_never_a_pending_slot() -> None:
    t = SlotPool([0, 1, 2], 3)
    t.advance(0)
    mine = _ready(t, 0, 5, step=1)  # layer 0 uses it at step 1
    _ready(t, 1, 6, step=1)  # layer 1 at step 1: not yet computed
    _ready(t, 2, 7, step=2)  # layer 2, prefetched for step 2
    t.advance(1, -1)
    assert t.steal(1, 0) is not None  # the slot needed latest: layer 2 at step 2
    assert t.slot_of(2, 7) is None and t.slot_of(1, 6) is not None
    t.advance(1, 0)
    _ready(t, 0, 3, step=2)  # layer 0's next-step expert takes the freed slot
    t.reserve(0, 5, step=2)  # and layer 0's current expert is predicted again
    # computing layer 1 at step 1 (layer 0 evaluated): layer 0's slots for step 2 may go,
    # but with layer 0 not evaluated (pending), none of its slots may
    assert t.steal(1, 1) is not None
    t2 = SlotPool([0, 1], 1)
    t2.advance(0)
    _ready(t2, 0, 1, step=1)
    t2.reserve(0, 1, step=2)
    t2.advance(1, -1)
    assert t2.steal(1, 1) is None  # layer 0's graph of step 1 is pending: its slot is read
    assert t.slots[mine].layer in (-1, 0)


def test_failed_slot_is_cleared_on_reset() -> None:
    t = SlotPool([0], 2)
    r = t.reserve(0, 4, step=0)
    assert r is not None
    t.mark_failed(r.slot, 0, 4)
    assert t.state(r.slot) is SlotState.FAILED
    t.clear_failed()
    assert t.slot_of(0, 4) is None and t.state(r.slot) is SlotState.EMPTY
    assert t.n_free == 2


def test_zero_slots_is_an_error() -> None:
    with pytest.raises(ValueError):
        SlotPool([0], 0)


def test_pool_size() -> None:
    assert pool_size(4, 40) == 4 * 42
    assert pool_size(8, 1, slack=0) == 16  # never below 2K
    assert pool_size(2, 3, slack=3, extra=5) == 2 * 6 + 5


def _checked(t: SlotPool, layer: int, expert: int, step: int) -> object:
    """reserve(), asserting that a rewritten slot's last reader had been evaluated."""
    before = [(s.reader, s.state) for s in t.slots]
    r = t.reserve(layer, expert, step)
    if r is not None and r.needs_read:
        reader, state = before[r.slot]
        assert reader <= t.evaluated and state is not SlotState.LOADING
    return r


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 4), n_layers=st.integers(1, 5), n_experts=st.integers(4, 12), data=st.data()
)
def test_pool_of_k_times_layers_plus_two_fits_every_step(
    k: int, n_layers: int, n_experts: int, data: st.DataObject
) -> None:
    """Per layer as the runtime does: inputs evaluated, release what missed, reserve the set
    compute needs, prefetch the next layer's set for the next step. Never short of slots,
    never a slot given to two experts, never a slot rewritten while its reader is pending."""
    layers = list(range(n_layers))
    t = SlotPool(layers, pool_size(k, n_layers))
    experts = st.lists(st.integers(0, n_experts - 1), min_size=1, max_size=k, unique=True)
    for step in range(6):
        t.advance(step - 1)
        for order, layer in enumerate(layers):
            t.advance(step, order - 1)
            needed = data.draw(experts)
            for e in list(t.where[layer]):
                if e not in needed:
                    t.release(layer, e, step)
            got: list = [_checked(t, layer, e, step) for e in needed]
            assert all(r is not None for r in got), "K x (L + 2) slots must fit compute"
            slots = [r.slot for r in got if r is not None]
            for e, s in zip(needed, slots, strict=True):
                t.mark_ready(s, layer, e)
            assert [(t.slots[s].layer, t.slots[s].expert) for s in slots] == [
                (layer, e) for e in needed
            ]
            target = layers[(order + 1) % n_layers]
            for e in data.draw(experts):
                r = _checked(t, target, e, step + 1)
                assert r is not None, "K x (L + 2) slots must fit the next step's prefetch"
                assert r.slot not in slots or (t.slots[r.slot].layer, t.slots[r.slot].expert) in {
                    (layer, x) for x in needed
                }
                t.mark_ready(r.slot, target, e)
