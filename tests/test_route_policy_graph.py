"""The in-graph available-first choice: the host rule's set without a readback, exact when
the true top-K is staged, and no host sync beyond `predicted`'s."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from runtime_helpers import build_store
from test_route_policy import _decode

from edge0.routing.families import family_for
from edge0.runtime.policy import host_rank, in_graph, staged_k
from edge0.runtime.policy_graph import choose_graph

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
    assert staged_k("available-first", None, True, 2, 32) == 4  # the pool stages 2K per layer
    assert staged_k("available-first", None, True, 4, 6) == 6
    assert staged_k("predicted", None, True, 2, 32) == 2


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("graph-store"), "qwen3_moe")


def decode(path: Path, **opts: Any) -> tuple[list[int], Any]:
    return asyncio.run(_decode(path, **opts))


def test_staged_wide_prediction_covering_every_expert_is_exact_routing(store: Path) -> None:
    """K = 4 of 8 experts: the wider prediction (2K) names all 8 and the warm RAM cache serves
    them, so every layer's candidates hold the true top-K: greedy tokens equal resident, the
    recall is 1, the host-side choice decodes the same, and the step has exactly
    `predicted`'s host syncs. (One-token prefill: a
    prompt chunk plans the first decode step without the wider prediction.)"""
    ref, _ = decode(store, mode="resident", top_k=4)
    kw: dict[str, Any] = dict(warm_cache=True, mode="route", predictor="init", top_k=4,
                              tiers="ram:64MiB>pread", prefill_chunk=1)  # fmt: skip
    _, pred = decode(store, **kw)
    got, eng = decode(store, route_policy="available-first", **kw)
    host, _ = decode(store, route_policy="available-first-sync", **kw)
    assert eng.setup.ctx.policy.on_device
    assert got == ref == host  # the graph's choice and the host's agree: both exact here
    assert eng.last_stats.route_recall == 1.0
    assert eng.last_stats.syncs_per_token == pred.last_stats.syncs_per_token
    assert eng.last_stats.syncs_per_token < 3  # one group of the 3 streamed layers + the fence


def test_the_host_choice_costs_a_sync_per_routed_layer_the_graph_choice_none(store: Path) -> None:
    """Same engine, K = 2, warm cache: available-first-sync reads every routed layer's scores
    back; available-first does not (the recall is still known: read with the group)."""
    kw: dict[str, Any] = dict(warm_cache=True, mode="route", predictor="init", top_k=2,
                              tiers="ram:64MiB>pread")  # fmt: skip
    _, pred = decode(store, **kw)
    got, dev = decode(store, route_policy="available-first", **kw)
    _, host = decode(store, route_policy="available-first-sync", **kw)
    routed = len(dev.setup.manifest.moe_layers) - 1  # the first MoE layer stays resident
    assert len(got) == N
    assert dev.last_stats.syncs_per_token == pred.last_stats.syncs_per_token
    assert host.last_stats.syncs_per_token == pred.last_stats.syncs_per_token + routed
    assert dev.last_stats.recall_slots == 2 * (N - 1) * routed
    assert 0 < dev.last_stats.route_recall <= 1
