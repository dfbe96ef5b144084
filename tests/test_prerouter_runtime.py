"""The streaming runtime consumes heads trained here: `route` mode with predictor="heads"."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from runtime_helpers import PROMPT, MockTier, build_store

import edge0.model.loader
from edge0.kernels.layers import NativeLinear
from edge0.routing.predictors import HeadPredictor
from edge0.routing.prerouter import PrerouterSet
from edge0.runtime.engine.api import Engine
from edge0.train.heads import HeadTrainConfig, train_heads
from edge0.train.traces import TraceSet, collect

STEER = [0, 1]  # the expert set a steered head always predicts


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("prerouter-rt"), "qwen3_moe")


@pytest.fixture(scope="module")
def trained(store: Path, tmp_path_factory: pytest.TempPathFactory) -> PrerouterSet:
    """Heads distilled (a few steps) on traces of the int4 store itself."""
    model = edge0.model.loader.load(store).model
    windows = ((np.arange(12)[:, None] * 5 + np.arange(16)[None] * 3) % 250 + 5).astype(np.int32)
    out = tmp_path_factory.mktemp("traces")
    collect(model, windows, out, batch=6, progress=False)
    cfg = HeadTrainConfig(k=2, batch=64, max_steps=20, eval_every=10, heldout_frac=0.25)
    heads, _ = train_heads(TraceSet.load(out), PrerouterSet.from_model(model), cfg, progress=False)
    return heads


async def _decode(path: Path, n: int, **opts: Any) -> tuple[list[int], Engine, MockTier]:
    tier = MockTier(path)
    async with Engine.open(path, tiers=tier, **opts) as eng:
        toks = [t async for t in eng.tokens(PROMPT, max_tokens=n, stop=False)]
        return toks, eng, tier


def test_route_mode_runs_trained_heads(store: Path, trained: PrerouterSet) -> None:
    trained.save(store)
    toks, eng, _ = asyncio.run(_decode(store, 8, mode="route", predictor="heads"))
    assert len(toks) == 8
    pred = eng.setup.ctx.predictor
    assert isinstance(pred, HeadPredictor)
    assert pred.name == "heads" and pred.heads.config.trained
    assert pred.heads.config.info["k"] == 2
    mods = [m for h in pred.heads.heads.values() for _, m in h.named_modules()]
    linears = [m for m in mods if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is NativeLinear for m in linears)  # native float products
    assert eng.last_stats is not None and eng.last_stats.tickets_issued > 0


def test_route_mode_executes_what_the_heads_predict(store: Path, trained: PrerouterSet) -> None:
    """Heads steered to always say STEER: after the prompt, no other expert is ever read."""
    e = trained.config.num_experts
    for head in trained.heads.values():
        bias = np.full(e, -100.0, dtype=np.float32)
        bias[STEER] = 100.0
        head.fc2.bias = mx.array(bias)
    trained.save(store)
    reads_other = []
    for n in (2, 8):  # both prefetch from the last prompt step (a 1-token request does not)
        toks, eng, tier = asyncio.run(_decode(store, n, mode="route", predictor="heads"))
        assert len(toks) == n
        reads_other.append(sum(1 for key in tier.reads if key.expert not in STEER))
        predicted = eng.setup.ctx.predictions()
        assert predicted and all(sorted(experts) == STEER for _, experts in predicted.values())
    # only the prompt (true routing) reads other experts: 6 more decode steps read none
    assert reads_other[0] == reads_other[1]
