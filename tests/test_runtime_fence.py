"""Route mode's slot fence under deferred syncs: a pool too small for a sync group still decodes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PROMPT, MockTier, build_store

from edge0.runtime.engine.api import Engine
from edge0.runtime.setup import prepare

N = 8  # decode tokens


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("fence"), "qwen3_5_moe", layers=8)


async def _decode(path: Path, **opts: Any) -> tuple[list[int], Any]:
    async with Engine.open(
        path, tiers=MockTier(path), mode="route", predictor="init", **opts
    ) as eng:
        toks = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]
        return toks, eng.setup.scheduler.stats


@pytest.mark.parametrize("group", [4, 8])
def test_a_pool_full_of_deferred_readers_fences_and_keeps_the_tokens(
    store: Path, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 layers' worth of slots: a group of 4 or 8 deferred layers cannot all hold theirs, so
    # acquire must raise FenceNeeded, the layer evaluates the pending group and asks again
    monkeypatch.setattr(prepare, "pool_size", lambda k, layers, *a, **kw: 3 * k)
    small, stats = asyncio.run(_decode(store, sync_every=group))
    assert stats.fences > 0, "the pool never filled with deferred readers: the test lost its point"
    ref, ref_stats = asyncio.run(_decode(store, sync_every=1))
    assert ref_stats.fences == 0  # one sync per layer: every acquire is fenced
    assert small == ref
    monkeypatch.undo()  # the default pool: no fence needed, same tokens again
    full, full_stats = asyncio.run(_decode(store, sync_every=group))
    assert full == ref and full_stats.fences == 0
