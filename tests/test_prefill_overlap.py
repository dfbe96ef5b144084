"""Chunked prefill reads the next layer's predicted first group early (router or heads): exact,
reads bounded, the heads' prediction made from the owner layer's hidden and sets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import MODEL_TYPES
from runtime_helpers import MockTier
from test_prefill import PROMPT, generate, with_random_heads

from edge0.errors import ConfigError
from edge0.routing.predictors import HeadPredictor
from edge0.runtime.engine.api import Engine
from edge0.runtime.prefill import chunks as prefill
from edge0.runtime.prefill.chunk_moe import stage_order
from edge0.runtime.prefill.chunks import ChunkState, by_count

PREFETCH = ChunkState.prefetch


def test_stage_order_puts_early_reads_first_and_decode_last() -> None:
    union = [0, 1, 2, 3, 4, 5]
    assert stage_order(union, [1, 4], [5, 9, 2]) == [5, 2, 0, 3, 1, 4]  # 9: not in the union
    assert stage_order(union, None, None) == union
    assert stage_order(union, [1, 4], [4, 5]) == [5, 0, 2, 3, 1, 4]  # decode's set stays last
    assert by_count(np.array([3, 1, 3, 2, 1, 3])) == [3, 1, 2]


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores[MODEL_TYPES[0]]  # the session's read-only store (conftest.py)


@pytest.fixture(scope="module")
def heads_store(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_random_heads(store, tmp_path_factory.mktemp("prefill-overlap-heads") / "e0")


def reads_of(
    path: Path,
    overlap: str,
    monkeypatch: pytest.MonkeyPatch,
    mode: str = "reactive",
    predictor: str | None = None,
    chunk: int = len(PROMPT),
) -> dict[str, Any]:
    """The prompt in chunks (default: one): tier reads by layer, early-read calls, routing."""
    monkeypatch.setattr(prefill, "OVERLAP", overlap)
    early: list[tuple[int, int, list[int]]] = []
    kept: list[set[int]] = []  # per early read: the experts kept for the first decode step

    def spy(self: ChunkState, layer: int, experts: list[int], ahead: int = 1) -> None:
        if ahead == 0:
            early.append((self.steps.step, layer, list(experts)))
            kept.append(set(self.decode_set(layer) or []))
        PREFETCH(self, layer, experts, ahead)

    monkeypatch.setattr(ChunkState, "prefetch", spy)
    tier = MockTier(path)

    async def go() -> dict[str, Any]:
        async with Engine.open(
            path,
            tiers=tier,
            mode=mode,
            predictor=predictor,
            prefill_chunk=chunk,
            record_routing=True,
        ) as eng:
            _ = [t async for t in eng.tokens(PROMPT, max_tokens=1, stop=False)]
            ctx = eng.setup.ctx
            streamed = sorted({n for _, n in ctx.recording} - set(ctx.resident_experts))
            union = {
                n: {e for p in range(len(PROMPT)) for e in ctx.recording[(p, n)]} for n in streamed
            }
            reads: dict[int, list[int]] = {}
            for key in tier.reads:
                reads.setdefault(key.layer, []).append(key.expert)
            return {
                "union": union,
                "reads": reads,
                "early": early,
                "kept": kept,
                "recording": ctx.recording,
            }

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


def test_heads_read_ahead_is_the_owned_heads_prediction(
    heads_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    rows = HeadPredictor.rows

    def spy(self: HeadPredictor, layer: int, x: Any, executed: Any, prev: Any, k: int) -> Any:
        out = rows(self, layer, x, executed, prev, k)
        calls.append((layer, np.array(executed), np.array(prev), np.array(out)))
        return out

    monkeypatch.setattr(HeadPredictor, "rows", spy)
    # chunks of 8, 8, 7 tokens: the first two read ahead (T x K >= COVER x E at K=2, E=8)
    got = reads_of(heads_store, "heads", monkeypatch, "route", "heads", chunk=8)
    router = reads_of(heads_store, "router", monkeypatch, "route", "heads", chunk=8)
    rec, streamed = got["recording"], sorted(got["union"])
    assert [n for _, n, _ in got["early"]] == streamed * 2  # every streamed layer, per chunk
    assert len(calls) == len(got["early"])
    for i, ((owner, executed, prev, out), (_, _, experts), kept) in enumerate(
        zip(calls, got["early"], got["kept"], strict=True)
    ):
        start = 8 * (i // len(streamed))
        # a row per token, each with its set and the one before; a request's first token
        # has no previous set: the first chunk's rows are tokens 1 .. 7
        tokens = range(max(start, 1), start + 8)
        assert executed.tolist() == [rec[(p, owner)] for p in tokens]
        assert prev.tolist() == [rec[(p - 1, owner)] for p in tokens]
        assert out.shape == (len(tokens), executed.shape[1])
        # read early: the most predicted first group (3 at K=2), less decode's experts
        assert experts == [e for e in by_count(out.reshape(-1)) if e not in kept][:3]
    # random heads predict other sets than the next router: the heads' are what is read
    assert [e for _, _, e in got["early"]] != [e for _, _, e in router["early"]]


def test_unknown_overlap_is_refused(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="OVERLAP 'head' is not one of none, router, heads"):
        reads_of(store, "head", monkeypatch)


EXACT = [
    ("router", "reactive", "init"),
    ("router", "route", "init"),
    ("heads", "route", "init"),
    ("heads", "route", "heads"),
    ("heads", "hint", "heads"),
]


@pytest.mark.parametrize(("overlap", "mode", "predictor"), EXACT)
def test_read_ahead_is_exact(
    store: Path,
    heads_store: Path,
    overlap: str,
    mode: str,
    predictor: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if predictor == "heads":
        store = heads_store  # random heads: their temporal inputs change the prediction
    one = asyncio.run(generate(store, PROMPT, 1, mode=mode, predictor=predictor))
    monkeypatch.setattr(prefill, "OVERLAP", overlap)
    clash: list[int] = []  # early reads of experts kept for the first decode step
    early_reads = [0]

    def spy(self: ChunkState, layer: int, experts: list[int], ahead: int = 1) -> None:
        if ahead == 0:
            early_reads[0] += 1
            clash.extend(set(experts) & set(self.decode_set(layer) or []))
        PREFETCH(self, layer, experts, ahead)

    monkeypatch.setattr(ChunkState, "prefetch", spy)
    got = asyncio.run(generate(store, PROMPT, 8, mode=mode, predictor=predictor))
    assert clash == []
    assert early_reads[0] > 0  # chunks of 8 at K=2, E=8 are read ahead (T x K >= COVER x E)
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)
