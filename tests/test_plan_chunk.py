"""The prompt chunk the memory plan chooses: by what a chunk holds against the budget and by
how far its reads amortise; exact against one-token prefill."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import build_store
from test_prefill import generate

from edge0.runtime.plan import chunk as plan_chunk
from edge0.runtime.plan import memory
from edge0.runtime.plan.chunk import AMORTISE, DEFAULT_CHUNK, amortised, saving, union
from edge0.runtime.plan.memory import Footprint, MemoryPlan, plan

MIB = 1 << 20


def shape35(k: int = 4, context: int = 4096) -> Footprint:
    """The 35B-A3B shape's footprint at route K=`k` (edge0.runtime.plan.footprint's figures for
    a random-weight layout of that shape, --first-layer wrap, untrained heads)."""
    return Footprint(
        resident=1454941696,
        resident_experts=0,
        heads=83886080,
        slot=2162688,
        record=1769472,
        layers=40,
        top_k=k,
        kv=167772160,
        state=65863680,
        working=83886080,
        overhead=89128960,
        chunk_fixed=171966464,
        chunk_token=(16 * 2048 + 3 * k * 2048 + 3 * 4096 + 2 * 16 * context) * 4,
        experts=256,
        context=context,
        prompt_k=k,
    )


def parts(p: MemoryPlan) -> int:
    """Every part the plan holds: what it promises the budget covers."""
    return (
        p.resident + p.heads + p.slots + p.kv + p.overhead + p.working + p.load + p.prompt + p.cache
    )


def test_reads_amortise_as_the_chunk_grows() -> None:
    """A token alone reads K records a layer; a chunk of C reads its union once."""
    assert saving(256, 4, 1) == pytest.approx(1.0)
    assert union(256, 4, 10_000) == pytest.approx(256)
    assert union(8, 8, 3) == 8  # every expert every token: the union is the layer
    xs = [saving(256, 4, c) for c in (1, 16, 64, 256, 1024)]
    assert xs == sorted(xs) and xs[-1] > xs[0]
    # the aim is the smallest chunk whose prompt tokens read AMORTISE times fewer records
    for e, k in ((256, 4), (256, 8), (128, 8), (8, 2), (64, 64)):
        c = amortised(e, k, 1 << 16)
        assert saving(e, k, c) >= AMORTISE and (c == 1 or saving(e, k, c - 1) < AMORTISE)
    assert amortised(256, 4, 1 << 16) == 1024 and amortised(256, 8, 1 << 16) == 512


@pytest.mark.parametrize("k", [4, 8])
def test_a_larger_budget_never_gives_a_smaller_chunk(k: int) -> None:
    """From the least budget the plan takes to 12 GiB: the chunk never shrinks, its memory
    fits half of what the fixed parts leave, and every part together fits the budget."""
    fp = shape35(k)
    low = plan(64 << 30, fp, 1)  # one-token prompts: the fixed parts and the whole remainder
    fixed = parts(low) - low.extra_slots * fp.slot
    last = 0
    for budget in range(fixed, 12 << 30, 32 * MIB):
        p = plan(budget, fp)
        assert p.prefill_chunk >= last, budget
        last = p.prefill_chunk
        assert p.prompt <= (budget - fixed) // 2 + MIB  # its share (the pool's ALIGN aside)
        assert parts(p) <= budget
        assert p.prompt == (0 if p.prefill_chunk == 1 else fp.chunk_fixed + last * fp.chunk_token)
        if p.prefill_chunk == 1:
            assert "one prompt token per step: a 2-token chunk holds" in p.line()
    assert last == amortised(256, k, 1 << 16)  # ample: where the reads amortise, no further


def test_the_35b_shape_at_3gib_takes_what_its_share_holds() -> None:
    """At 3 GiB (route K=4) the chunk passes the former 256-token cap, and the line says
    what it trades; at 6 GiB it stops where its reads amortise."""
    tight = plan(3 << 30, shape35(4))
    assert tight.prefill_chunk == 354 > DEFAULT_CHUNK
    line = tight.line()
    assert "prompt chunk 435 (354 tokens)" in line
    assert "the most half of the 870 MiB left holds" in line
    assert "~5.6x fewer expert records than one token per step" in line
    assert "1024 tokens (~16x) would need 948 MiB" in line
    ample = plan(6 << 30, shape35(4))
    assert ample.prefill_chunk == 1024
    assert "the prompt chunk stops at 1024 tokens (~16x, where its reads amortise:" in ample.line()
    assert "\n" not in line + ample.line()


def test_no_chunk_is_longer_than_the_context() -> None:
    assert plan(8 << 30, shape35(4, context=300)).prefill_chunk == 300
    assert "(the context: no prompt is longer)" in plan(8 << 30, shape35(4, context=300)).line()


def test_nothing_streamed_keeps_the_default() -> None:
    fp = Footprint(100 * MIB, 0, 0, 0, 0, 0, 2, 0, 0, 10 * MIB, 10 * MIB, 8 * MIB, MIB)
    p = plan(4 << 30, fp)
    assert p.prefill_chunk == DEFAULT_CHUNK and p.chunk_note == ""


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("plan-chunk"), "qwen3_5_moe", max_positions=512)


def test_a_chunk_past_the_default_equals_one_token(
    hybrid: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's chunk (here 300 tokens: the tiny model's reads amortise at once, so the aim is
    raised and the context caps it) runs a 290-token prompt in one forward: the same tokens,
    logits within 1e-4 of one token per step."""
    monkeypatch.setattr(plan_chunk, "AMORTISE", 10_000)
    monkeypatch.setattr(memory, "more_resident", lambda *a: 0)  # the chunk over streamed layers
    prompt = [int(t) for t in np.random.default_rng(0).integers(2, 250, 290)]
    opts = dict(mode="route", predictor="init", context=300)
    got = asyncio.run(generate(hybrid, prompt, None, memory_budget="4GiB", **opts))  # type: ignore[arg-type]
    setup = got["engine"].setup
    assert setup.ctx.prefill_chunk == setup.memory_plan.prefill_chunk == 300
    assert sum(r.prefill for r in setup.ctx.records) == 1  # one forward for the prompt
    one = asyncio.run(generate(hybrid, prompt, 1, **opts))
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)
