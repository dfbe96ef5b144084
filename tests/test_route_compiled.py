"""A one-token route step runs its heads' top-k and its layers' gate weights with weighted sum as
compiled functions: the same predictions, logits and tokens as the ops one by one, in fewer
graph nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from route_helpers import graph_nodes, store_with_random_heads
from runtime_helpers import PROMPT, MockTier

import edge0.model.loader
from edge0.model import generate
from edge0.routing import predictors
from edge0.routing.predictors import HeadPredictor, host_hots
from edge0.routing.prerouter import PrerouterSet
from edge0.routing.prerouter_heads import PrerouterHead
from edge0.runtime.engine.api import Engine
from edge0.runtime.layers import single

N = 12  # decode tokens


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return store_with_random_heads(tmp_path_factory.mktemp("route-compiled"))


def _uncompiled(m: pytest.MonkeyPatch) -> None:
    m.setattr(predictors, "COMPILED", False)
    m.setattr(single, "COMPILED", False)


@pytest.mark.parametrize("lean", [False, True])
@pytest.mark.parametrize("prev", [None, [4, 1]])
def test_a_compiled_head_predicts_what_its_ops_do(
    store: Path, monkeypatch: pytest.MonkeyPatch, lean: bool, prev: list[int] | None
) -> None:
    model = edge0.model.loader.load(store).model
    heads = PrerouterSet.from_model(model, lean=True) if lean else PrerouterSet.load(store)
    pred = HeadPredictor(heads, "init" if lean else "heads")
    rng = np.random.default_rng(3)
    cur = [2, 0]
    cur_mx = mx.array([[cur]], dtype=mx.uint32)
    prev_mx = None if prev is None else mx.array([[prev]], dtype=mx.uint32)
    for owner in heads.heads:
        for _ in range(4):
            x = mx.array(rng.normal(size=(1, 1, heads.config.d_model)), mx.float32)
            new = pred.graph(owner, x, cur_mx, prev_mx, 2, sets=(cur, prev))
            with monkeypatch.context() as m:
                _uncompiled(m)
                old = pred.graph(owner, x, cur_mx, prev_mx, 2, sets=(cur, prev))
            assert new is not None and old is not None
            if not lean:  # the lean head is one product: nothing to fuse
                assert graph_nodes(new) < graph_nodes(old)
            assert new.tolist() == old.tolist()
    if not lean:  # the head's inputs the same way, bit for bit: the logits of both paths
        owner = next(iter(heads.heads))
        x = mx.array(rng.normal(size=(heads.config.d_model,)), mx.float32)
        hots = host_hots(heads, (cur, prev))
        logits = mx.compile(lambda a, h: heads.predict_hots(owner, a, h))(x, hots)
        assert mx.array_equal(logits, heads.predict_hots(owner, x, hots)).item()


def test_a_compiled_head_reads_replaced_weights(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heads = PrerouterSet.load(store)
    pred = HeadPredictor(heads, "heads")
    owner = next(iter(heads.heads))
    rng = np.random.default_rng(4)
    x = mx.array(rng.normal(size=(1, 1, heads.config.d_model)), mx.float32)
    inds = mx.array([[1, 3]], dtype=mx.uint32)
    sets = ([1, 3], None)
    before = pred.graph(owner, x, inds, None, 2, sets=sets)  # compiled before the change
    assert before is not None
    head = heads.heads[owner]
    assert isinstance(head, PrerouterHead)
    for _ in range(3):  # new arrays in the head: the compiled function reads them, not constants
        shape = head.lin_h.weight.shape
        head.lin_h.weight = mx.array(rng.normal(0, 2.0, shape).astype(np.float32))
        new = pred.graph(owner, x, inds, None, 2, sets=sets)
        with monkeypatch.context() as m:
            _uncompiled(m)
            old = pred.graph(owner, x, inds, None, 2, sets=sets)
        assert new is not None and old is not None
        assert new.tolist() == old.tolist()


async def _decode(path: Path, prompt: list[int], **opts: Any) -> tuple[list[int], list[Any]]:
    logits: list[mx.array] = []
    real = generate.Sampler.__call__

    def keep(self: generate.Sampler, x: mx.array) -> mx.array:
        logits.append(x)
        return real(self, x)

    generate.Sampler.__call__ = keep  # type: ignore[method-assign]
    try:
        async with Engine.open(path, tiers=MockTier(path), **opts) as eng:
            toks = [t async for t in eng.tokens(prompt, max_tokens=N, stop=False)]
    finally:
        generate.Sampler.__call__ = real  # type: ignore[method-assign]
    return toks, [np.array(x) for x in logits]


@pytest.mark.parametrize(
    "opts",
    [
        {"predictor": "heads", "sync_every": 4},
        {"predictor": "heads", "sync_every": 2, "first_layer": "wrap"},
        {"predictor": "heads", "sync_every": 1},
        {"predictor": "init", "sync_every": 4},
        {"predictor": "heads", "sync_every": 4, "top_k": 2},
    ],
)
@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:1]])
def test_route_tokens_and_logits_equal_the_uncompiled_path(
    store: Path, monkeypatch: pytest.MonkeyPatch, opts: dict[str, Any], prompt: list[int]
) -> None:
    calls: list[int] = []
    real = single._grouped

    def spy(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(single, "_grouped", spy)
    new, new_logits = asyncio.run(_decode(store, prompt, mode="route", **opts))
    assert bool(calls) == (opts["sync_every"] > 1)  # grouped steps take the compiled sum
    with monkeypatch.context() as m:
        _uncompiled(m)
        calls.clear()
        old, old_logits = asyncio.run(_decode(store, prompt, mode="route", **opts))
        assert not calls
    assert new == old
    assert len(new_logits) == len(old_logits)
    for a, b in zip(new_logits, old_logits, strict=True):
        assert np.array_equal(a, b)  # bit for bit
