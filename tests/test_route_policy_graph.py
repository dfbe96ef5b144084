"""The in-graph available-first choice: the host rule's set without a readback, exact when
the true top-K is staged, and no host sync beyond `predicted`'s."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from runtime_helpers import PROMPT, MockTier
from test_route_policy import _decode

from edge0.families import family_for
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.slots import SlotState
from edge0.runtime.layers.policy import host_rank, in_graph, route_slots
from edge0.runtime.layers.policy_graph import choose_graph

N = 10


class _Block:
    norm_topk_prob = True


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_the_choice_is_the_host_rules_set(family: str) -> None:
    """Random scores and candidate masks: the graph's K experts are the first K candidates of
    the host policy's ranking (true top-K first, then by score); when every true expert is a
    candidate they are the router's own indices and gate weights, bit for bit."""
    fam, block, rng = family_for(family), _Block(), np.random.default_rng(0)
    e, k, exact_seen, other_seen = 16, 4, 0, 0
    for _ in range(60):
        logits = mx.array(rng.normal(size=(1, 1, e)).astype(np.float32))
        scores = mx.softmax(logits, axis=-1) if family == "qwen3_moe" else logits  # its rule
        true_inds, w_true = fam.select(block, scores, k)
        allowed = rng.random(e) < rng.uniform(0.2, 1.0)
        allowed[rng.choice(e, size=k, replace=False)] = True  # the predicted set: K servable
        inds, w = choose_graph(fam, block, scores, true_inds, w_true, mx.array(allowed), k)
        true = true_inds.reshape(-1).tolist()
        rank = host_rank(true, scores.reshape(-1).tolist())
        want = [x for x in rank if allowed[x]][:k]
        assert sorted(inds.reshape(-1).tolist()) == sorted(want)
        if all(allowed[true]):
            exact_seen += 1
            assert inds.tolist() == true_inds.tolist()
            assert np.array_equal(np.array(w), np.array(w_true))
        else:
            other_seen += 1
            ref = fam.weights(block, scores, mx.array([[want]], dtype=true_inds.dtype))
            got = dict(zip(inds.reshape(-1).tolist(), np.array(w).reshape(-1), strict=True))
            assert np.allclose([got[x] for x in want], np.array(ref).reshape(-1), atol=1e-6)
    assert exact_seen and other_seen  # both branches were exercised


def test_which_configurations_choose_in_the_graph() -> None:
    assert in_graph("available-first", 0.0, grouped=True)
    assert not in_graph("available-first", 5.0, grouped=True)  # waits: on the host
    assert not in_graph("available-first", 0.0, grouped=False)  # --sync-every 1
    assert not in_graph("available-first-sync", 0.0, grouped=True)
    # the pool grows into a cache of 8K experts per layer, within 64 MiB, never past all
    assert route_slots("available-first", None, True, 18, 2, 32, 7, 65536) == 16 * 9
    assert route_slots("available-first", None, True, 18, 2, 8, 7, 65536) == 8 * 7 + 18
    assert route_slots("available-first", None, True, 336, 8, 256, 40, 1 << 21) == 336 + 32
    assert route_slots("predicted", None, True, 18, 2, 32, 7, 65536) == 18
    assert route_slots("available-first", 1.0, True, 18, 2, 32, 7, 65536) == 18


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]  # the session's read-only store (conftest.py)


def decode(path: Path, **opts: Any) -> tuple[list[int], Any]:
    return asyncio.run(_decode(path, **opts))


async def _decode_staged(path: Path, **opts: Any) -> tuple[list[int], Any]:
    """Decode after every streamed expert was read into the slot pool (the in-graph choice's
    pool holds them all: nothing is evicted afterwards)."""
    async with Engine.open(path, tiers=MockTier(path), **opts) as eng:
        sched = eng.setup.scheduler
        for layer in sched.table.where:
            sched.prefetch(layer, sched.now + 1, list(range(eng.setup.manifest.n_experts)))
        while any(s.state is not SlotState.READY for s in sched.table.slots if s.layer >= 0):
            await asyncio.sleep(0.01)
        toks = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]
        return toks, eng


def test_a_pool_holding_every_expert_makes_the_graph_choice_exact(store: Path) -> None:
    """Every expert staged: every layer's candidates hold the true top-K, so the in-graph
    choice is exact routing: greedy tokens equal resident, the recall is 1, and the step has
    exactly `predicted`'s host syncs."""
    ref, _ = decode(store, mode="resident")
    kw: dict[str, Any] = dict(mode="route", predictor="init")
    _, pred = decode(store, **kw)
    got, eng = asyncio.run(_decode_staged(store, route_policy="available-first", **kw))
    assert eng.setup.ctx.policy.on_device
    assert eng.setup.scheduler.table.n_slots >= 8 * 3  # the grown pool: all 8 x 3 experts
    assert got == ref  # as the host-side choice with every expert in RAM (test_route_policy)
    assert eng.last_stats.route_recall == 1.0
    assert eng.last_stats.syncs_per_token == pred.last_stats.syncs_per_token
    assert eng.last_stats.syncs_per_token < 3  # one group of the 3 streamed layers + the fence
    assert eng.setup.scheduler.stats.demand == 0  # nothing was read on demand


def test_the_host_choice_costs_a_sync_per_routed_layer_the_graph_choice_none(store: Path) -> None:
    """Same engine, K = 2, warm cache: available-first-sync reads every routed layer's scores
    back; available-first does not (the recall is still known: read with the group)."""
    kw: dict[str, Any] = dict(
        warm_cache=True, mode="route", predictor="init", top_k=2, tiers="ram:64MiB>pread"
    )
    _, pred = decode(store, **kw)
    got, dev = decode(store, route_policy="available-first", **kw)
    _, host = decode(store, route_policy="available-first-sync", **kw)
    routed = len(dev.setup.manifest.moe_layers) - 1  # the first MoE layer stays resident
    assert len(got) == N
    assert dev.last_stats.syncs_per_token == pred.last_stats.syncs_per_token
    assert host.last_stats.syncs_per_token == pred.last_stats.syncs_per_token + routed
    assert dev.last_stats.recall_slots == 2 * (N - 1) * routed
    assert 0 < dev.last_stats.route_recall <= 1
