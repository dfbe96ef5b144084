"""Hint over a slow tier: a layer's staged experts are computed while its missing ones are read,
and the tokens stay resident's, bit for bit; nothing is read twice in a step."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runtime_helpers import PROMPT, MockTier, Recording, build_store

from edge0.options.sampling import SamplingSettings
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.scheduler import Scheduler

FAMILIES = ["qwen3_moe", "qwen3_5_moe"]
N = 8
DELAY = 0.015  # seconds a MockTier read takes: far longer than a tiny expert's compute
SLOW = "throttle:bw=1MB/s,lat=2ms>pread"  # a blocking stack: the reader threads' path


@pytest.fixture(scope="module")
def stores(runtime_stores: dict[str, Path]) -> dict[str, Path]:
    return {mt: runtime_stores[mt] for mt in FAMILIES}


def decode(path: Path, prompt: list[int] = PROMPT, **opts: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        if opts.get("mode") != "resident":
            opts.setdefault("tiers", MockTier(path, delay=DELAY))
            opts.setdefault("overlap", True)
        rec = Recording()
        async with Engine.open(path, **opts) as eng:
            greedy = SamplingSettings(hooks=rec)
            toks = eng.tokens(prompt, max_tokens=N, stop=False, sampling=greedy)
            got = [t async for t in toks]
            logprobs = np.stack([np.array(a.reshape(-1)) for a in rec.seen])
            return {"tokens": got, "logprobs": logprobs, "engine": eng}

    return asyncio.run(asyncio.wait_for(go(), 120))


def events(eng: Engine, cat: str) -> list[dict[str, Any]]:
    return [e for e in eng.setup.tracer.events if e.get("cat", "").startswith(cat)]


@pytest.mark.parametrize("family", FAMILIES)
def test_hint_equals_resident_over_a_slow_tier(
    stores: dict[str, Path], family: str, tmp_path: Path
) -> None:
    """Tokens equal resident's; the log-probabilities equal hint's with each layer's slots
    taken in one piece (the path before the overlap) bit for bit; the overlap ran."""
    path = stores[family]
    ref = decode(path, mode="resident")
    got = decode(path, mode="hint", predictor="init", trace=tmp_path / "t.json")
    assert got["tokens"] == ref["tokens"]
    assert events(got["engine"], "compute.partial"), "no layer computed a staged part early"
    whole = decode(path, mode="hint", predictor="init", overlap=False, trace=tmp_path / "w.json")
    assert not events(whole["engine"], "compute.partial")
    assert whole["tokens"] == ref["tokens"]
    assert np.array_equal(got["logprobs"], whole["logprobs"])


def test_hint_equals_resident_through_the_reader_threads(stores: dict[str, Path]) -> None:
    path = stores["qwen3_5_moe"]
    ref = decode(path, mode="resident", top_k=3)
    got = decode(path, mode="hint", predictor="init", top_k=3, tiers=SLOW)
    assert got["tokens"] == ref["tokens"]


def batched(
    path: Path, prompts: list[list[int]], trace: Path, overlap: bool = True
) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        tier = MockTier(path, delay=DELAY)
        recs = [Recording() for _ in prompts]
        async with Engine.open(
            path,
            mode="hint",
            predictor="init",
            tiers=tier,
            max_batch=3,
            trace=trace,
            overlap=overlap,
        ) as eng:

            async def one(p: list[int], rec: Recording) -> list[int]:
                greedy = SamplingSettings(hooks=rec)
                return [t async for t in eng.tokens(p, max_tokens=N, stop=False, sampling=greedy)]

            toks = await asyncio.gather(*(one(p, r) for p, r in zip(prompts, recs, strict=True)))
            logprobs = [np.stack([np.array(a.reshape(-1)) for a in r.seen]) for r in recs]
            return {"tokens": list(toks), "logprobs": logprobs, "engine": eng}

    return asyncio.run(asyncio.wait_for(go(), 120))


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_hint_equals_resident_over_a_slow_tier(
    runtime_store_root: Path, family: str, tmp_path: Path
) -> None:
    """Three requests decoding together: each gets its tokens alone under resident, and the
    log-probabilities of the one-piece path bit for bit; the overlap ran (64 experts a
    layer: the pool, sized for the batch, would hold all of the default store's)."""
    path = build_store(runtime_store_root, family, experts=64)
    prompts = [PROMPT, [9, 3, 77], [200, 11, 5, 6]]
    refs = [decode(path, p, mode="resident")["tokens"] for p in prompts]
    got = batched(path, prompts, tmp_path / "t.json")
    assert got["tokens"] == refs
    assert events(got["engine"], "compute.partial"), "no batched layer computed a part early"
    whole = batched(path, prompts, tmp_path / "w.json", overlap=False)
    assert not events(whole["engine"], "compute.partial")
    assert whole["tokens"] == refs
    for a, b in zip(got["logprobs"], whole["logprobs"], strict=True):
        assert np.array_equal(a, b)


def test_staged_experts_start_computing_before_the_last_read_lands(
    stores: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each part of a layer computed early (launched, a `partial` span) starts before the last
    of the reads that layer still waits for at that moment (the tickets of its slots still
    loading) lands."""
    waiting: dict[tuple[int, int], list[list[Any]]] = collections.defaultdict(list)
    arrived = Scheduler.arrived

    def spy(self: Scheduler, layer: int, step: int, experts: Any, slots: Any, pending: Any) -> Any:
        done = arrived(self, layer, step, experts, slots, pending)
        left = [self._loader[(layer, slots[i])] for i in pending if i not in done]
        if left:  # the part just arrived is computed while these are read
            waiting[(step, layer)].append(left)
        return done

    monkeypatch.setattr(Scheduler, "arrived", spy)
    got = decode(stores["qwen3_moe"], mode="hint", predictor="init", trace=tmp_path / "t.json")
    tracer = got["engine"].setup.tracer
    partial = collections.defaultdict(list)
    for p in events(got["engine"], "compute.partial"):
        partial[(p["args"]["step"], p["args"]["layer"])].append(float(p["ts"]))
    assert partial and sorted(partial) == sorted(waiting)
    for key, starts in partial.items():
        assert len(starts) == len(waiting[key])
        for start, left in zip(starts, waiting[key], strict=True):
            landed = max(tracer._us(t.finished) for t in left)
            assert start < landed, f"step {key[0]} layer {key[1]}: computed after its reads"


def test_no_expert_is_read_twice_in_a_step(stores: dict[str, Path], tmp_path: Path) -> None:
    """Each (step, layer, expert) is read at most once, and a layer's missing experts are
    read before the prefetch its own prediction makes for the next step."""
    got = decode(stores["qwen3_5_moe"], mode="hint", predictor="init", trace=tmp_path / "t.json")
    eng = got["engine"]
    reads = [r["args"] for r in events(eng, "read.")]
    assert any(r["kind"] == "demand" for r in reads)
    kept = [r for r in reads if r["outcome"] != "cancelled"]
    done = collections.Counter((r["request"], r["step"], r["layer"], r["expert"]) for r in kept)
    assert done and max(done.values()) == 1, [k for k, n in done.items() if n > 1]
    stats = eng.setup.scheduler.counters()
    assert stats.issued == len(reads) and stats.issued == sum(done.values()) + stats.cancelled
    started: dict[tuple[str, int, int], list[float]] = collections.defaultdict(list)
    for r in events(eng, "read."):
        a = r["args"]
        started[(a["kind"], a["step"], a["layer"])].append(float(r["ts"]))
    owners = {
        layer: s.head.target.layer
        for layer, s in eng.setup.ctx.layers.items()
        if getattr(s, "head", None) is not None
    }
    checked = 0
    for (kind, step, layer), times in started.items():
        ahead = started.get(("prefetch", step + 1, owners.get(layer, -1)))
        if kind == "demand" and ahead:
            assert max(times) <= min(ahead), f"step {step} layer {layer}: prefetch read first"
            checked += 1
    assert checked
