"""Chunked prefill reads the next layer's predicted first group early: exact, reads bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import MODEL_TYPES
from runtime_helpers import MockTier, build_store
from test_prefill import PROMPT, generate

from edge0.runtime import prefill
from edge0.runtime.chunk_moe import stage_order
from edge0.runtime.engine import Engine
from edge0.runtime.prefill import ChunkState, by_count

PREFETCH = ChunkState.prefetch


def test_stage_order_puts_early_reads_first_and_decode_last() -> None:
    union = [0, 1, 2, 3, 4, 5]
    assert stage_order(union, [1, 4], [5, 9, 2]) == [5, 2, 0, 3, 1, 4]  # 9: not in the union
    assert stage_order(union, None, None) == union
    assert stage_order(union, [1, 4], [4, 5]) == [5, 0, 2, 3, 1, 4]  # decode's set stays last
    assert by_count(np.array([3, 1, 3, 2, 1, 3])) == [3, 1, 2]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("prefill-overlap"), MODEL_TYPES[0])


def reads_of(path: Path, overlap: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """One reactive chunk over the prompt: tier reads by layer, early-read calls, routing."""
    monkeypatch.setattr(prefill, "OVERLAP", overlap)
    early: list[tuple[int, int, list[int]]] = []

    def spy(self: ChunkState, layer: int, experts: list[int], ahead: int = 1) -> None:
        if ahead == 0:
            early.append((self.steps.step, layer, list(experts)))
        PREFETCH(self, layer, experts, ahead)

    monkeypatch.setattr(ChunkState, "prefetch", spy)
    tier = MockTier(path)

    async def go() -> dict[str, Any]:
        async with Engine.open(path, tiers=tier, mode="reactive", prefill_chunk=len(PROMPT),
                               record_routing=True) as eng:  # fmt: skip
            _ = [t async for t in eng.tokens(PROMPT, max_tokens=1, stop=False)]
            ctx = eng.setup.ctx
            streamed = sorted({n for _, n in ctx.recording} - set(ctx.resident_experts))
            union = {n: {e for p in range(len(PROMPT)) for e in ctx.recording[(p, n)]}
                     for n in streamed}  # fmt: skip
            reads: dict[int, list[int]] = {}
            for key in tier.reads:
                reads.setdefault(key.layer, []).append(key.expert)
            return {"union": union, "reads": reads, "early": early}

    return asyncio.run(go())


def test_each_layer_after_the_first_is_read_ahead(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = reads_of(store, "none", monkeypatch)
    on = reads_of(store, "router", monkeypatch)
    assert off["early"] == []
    for layer, union in off["union"].items():
        assert sorted(off["reads"][layer]) == sorted(union)  # each once, nothing else
    # every streamed layer was read ahead (the first from the resident layer 0), once
    assert [n for _, n, _ in on["early"]] == sorted(on["union"])
    for _, layer, experts in on["early"]:
        union = on["union"][layer]
        wasted = [e for e in experts if e not in union]
        assert sorted(on["reads"][layer]) == sorted(union | set(wasted))  # mispredicted: once
        assert len(experts) <= 3  # one group of the default pool (3K/2 at K=2)


@pytest.mark.parametrize("mode", ["reactive", "route"])
def test_read_ahead_is_exact(store: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    one = asyncio.run(generate(store, PROMPT, 1, mode=mode, predictor="init"))
    monkeypatch.setattr(prefill, "OVERLAP", "router")
    clash: list[int] = []  # early reads of experts kept for the first decode step

    def spy(self: ChunkState, layer: int, experts: list[int], ahead: int = 1) -> None:
        if ahead == 0:
            clash.extend(set(experts) & set(self.decode_set(layer) or []))
        PREFETCH(self, layer, experts, ahead)

    monkeypatch.setattr(ChunkState, "prefetch", spy)
    got = asyncio.run(generate(store, PROMPT, 8, mode=mode, predictor="init"))
    assert clash == []
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logits"], one["logits"], atol=1e-4, rtol=0)
