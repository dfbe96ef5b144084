"""Route mode's heads take the executed and previous sets as host lists: the same predictions
and tokens as the multi-hot built in the graph, in fewer graph nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from route_helpers import graph_nodes, store_with_random_heads
from runtime_helpers import PROMPT, MockTier

from edge0.routing.predictors import HeadPredictor, host_hots
from edge0.routing.prerouter import PrerouterSet
from edge0.routing.prerouter_heads import multi_hot
from edge0.runtime.engine.api import Engine
from edge0.runtime.layers.streams import LayerStream

N = 12  # decode tokens


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return store_with_random_heads(tmp_path_factory.mktemp("host-sets"))


def test_host_hots_are_the_graphs_multi_hots(store: Path) -> None:
    heads = PrerouterSet.load(store)
    e = heads.config.num_experts
    for cur, prev in (([3, 0, 5], None), ([1, 2], [2, 7, 1])):
        want = mx.concatenate(
            [
                multi_hot(mx.array(cur), e, ()),
                multi_hot(None if prev is None else mx.array(prev), e, ()),
            ]
        )
        got = host_hots(heads, (cur, prev))
        assert got.dtype == want.dtype == mx.float32
        assert mx.array_equal(got, want).item()


@pytest.mark.parametrize("prev", [None, [4, 1]])
def test_a_head_predicts_the_same_from_host_sets(store: Path, prev: list[int] | None) -> None:
    heads = PrerouterSet.load(store)
    pred = HeadPredictor(heads, "heads")
    x = mx.array(np.random.default_rng(1).normal(size=(1, 1, heads.config.d_model)), mx.float32)
    cur = [2, 0]
    owner = next(iter(heads.heads))
    prev_mx = None if prev is None else mx.array([[prev]], dtype=mx.uint32)
    cur_mx = mx.array([[cur]], dtype=mx.uint32)
    for ranked in (False, True):
        old = pred.graph(owner, x, cur_mx, prev_mx, 2, ranked)
        new = pred.graph(owner, x, cur_mx, prev_mx, 2, ranked, sets=(cur, prev))
        assert old is not None and new is not None
        assert graph_nodes(new) < graph_nodes(old)  # the multi-hots cost no nodes
        assert old.tolist() == new.tolist()
    prev_flat = None if prev_mx is None else prev_mx.reshape(-1)
    logits_old = heads.predict(owner, x.reshape(-1), cur_mx.reshape(-1), prev_flat)
    logits_new = heads.predict_hots(owner, x.reshape(-1), host_hots(heads, (cur, prev)))
    assert mx.array_equal(logits_old, logits_new).item()  # bit for bit


async def _decode(path: Path, prompt: list[int], **opts: Any) -> tuple[list[int], Any]:
    async with Engine.open(path, tiers=MockTier(path), **opts) as eng:
        toks = [t async for t in eng.tokens(prompt, max_tokens=N, stop=False)]
        return toks, eng


def _graph_sets_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path before host sets: every head builds its multi-hots in the graph."""
    real = LayerStream.host_sets

    def none(self: LayerStream, inds: mx.array) -> None:
        real(self, inds)  # keeps the stream's bookkeeping
        return None

    monkeypatch.setattr(LayerStream, "host_sets", none)


@pytest.mark.parametrize(
    "opts",
    [
        {"sync_every": 1},
        {"sync_every": 4},
        {"sync_every": 2, "first_layer": "wrap"},
        {"sync_every": 4, "prefill_chunk": 4},
    ],
)
@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:1]])
def test_route_tokens_equal_the_graph_multi_hot_path(
    store: Path, monkeypatch: pytest.MonkeyPatch, opts: dict[str, Any], prompt: list[int]
) -> None:
    calls: list[bool] = []
    real = HeadPredictor.graph

    def spy(self: HeadPredictor, *a: Any, **kw: Any) -> Any:
        calls.append(kw.get("sets") is not None)
        return real(self, *a, **kw)

    monkeypatch.setattr(HeadPredictor, "graph", spy)
    new, eng = asyncio.run(_decode(store, prompt, mode="route", predictor="heads", **opts))
    assert eng.setup.ctx.predictor.heads.config.trained
    assert any(calls)  # the host sets were used in decode steps
    with monkeypatch.context() as m:
        _graph_sets_only(m)
        calls.clear()
        old, _ = asyncio.run(_decode(store, prompt, mode="route", predictor="heads", **opts))
        assert not any(calls)
    assert new == old


def test_batched_route_rows_equal_their_solo_runs(store: Path) -> None:
    """A batch's rows take the graph's multi-hots (their sets are arrays): solo tokens."""
    solo, _ = asyncio.run(_decode(store, PROMPT, mode="route", predictor="heads", sync_every=1))

    async def two() -> list[list[int]]:
        async with Engine.open(
            store, tiers=MockTier(store), mode="route", predictor="heads", max_batch=2
        ) as eng:

            async def one() -> list[int]:
                return [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]

            return list(await asyncio.gather(one(), one()))

    for row in asyncio.run(two()):
        assert row == solo
