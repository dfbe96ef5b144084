"""hint's prefetch width: tokens equal resident's at any width; auto follows the measured hit
rates and costs, and goes above K only where the slot pool has room."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PROMPT, MockTier
from structlog.testing import capture_logs

from edge0 import log
from edge0.errors import ConfigError
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.slots import pool_size
from edge0.runtime.io.tickets import PREFETCH
from edge0.runtime.layers.width import Width, best_width, room

FAMILIES = ["qwen3_moe", "qwen3_5_moe"]
N = 12
K = 2


@pytest.fixture(scope="module")
def stores(runtime_stores: dict[str, Path]) -> dict[str, Path]:
    return {mt: runtime_stores[mt] for mt in FAMILIES}


def decode(path: Path, now: int | None = None, **opts: Any) -> tuple[list[int], Any]:
    async def go() -> tuple[list[int], Any]:
        opts.setdefault("tiers", MockTier(path, delay=0.002))
        async with Engine.open(path, top_k=K, **opts) as eng:
            width = eng.setup.ctx.width if opts["mode"] == "hint" else None
            if width is not None and width.auto:  # decide often in a short run
                width.every, width.min_samples = 2, 2
                if now is not None:  # held at `now`: scored, never re-decided
                    width.now, width.min_samples = now, 1 << 30
            toks = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]
            return toks, eng

    return asyncio.run(asyncio.wait_for(go(), 120))


def prefetches(eng: Engine) -> collections.Counter[tuple[int, int]]:
    """Prefetch reads per (layer, step) for the decode steps after the first (the first's
    come from the prompt's last chunk, which predicts K), from the trace."""
    decode = sorted(r.step for r in eng.setup.ctx.records if not r.prefill)[1:]
    reads = [e["args"] for e in eng.setup.tracer.events if e.get("cat", "").startswith("read.")]
    return collections.Counter(
        (r["layer"], r["step"]) for r in reads if r["kind"] == PREFETCH and r["step"] in decode
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_hint_tokens_equal_resident_at_every_width(
    stores: dict[str, Path], family: str, tmp_path: Path
) -> None:
    path = stores[family]
    ref, _ = decode(path, mode="resident")
    n_experts = None
    for width in (1, K, 2 * K, "auto"):
        got, eng = decode(
            path, mode="hint", predictor="init", prefetch_width=width, trace=tmp_path / "t.json"
        )
        assert got == ref, f"prefetch width {width}"
        w = eng.setup.ctx.width
        n_experts = eng.setup.manifest.n_experts
        assert eng.last_stats.prefetch_width == w.now
        if width == "auto":
            assert w.auto and w.decisions > 0 and w.samples > 0
            assert w.ranks == min(n_experts, 2 * K)
        else:
            assert w.now == width and not w.auto
            assert max(prefetches(eng).values()) <= width
    assert n_experts is not None and n_experts >= 2 * K
    got, eng = decode(path, now=0, mode="hint", predictor="init", trace=tmp_path / "z.json")
    assert got == ref and not prefetches(eng)  # auto at 0: scored, nothing read ahead
    assert eng.setup.ctx.width.samples > 0
    _, eng = decode(path, mode="hint", predictor="init", prefetch_width=2 * K, trace=tmp_path / "w")
    assert max(prefetches(eng).values()) > K  # the wider set was read


def test_route_refuses_another_width(stores: dict[str, Path]) -> None:
    path = stores["qwen3_moe"]
    with pytest.raises(ConfigError, match="route mode runs the experts it prefetches"):
        decode(path, mode="route", predictor="init", prefetch_width=K + 1)
    toks, eng = decode(path, mode="route", predictor="init", prefetch_width=K)
    assert eng.setup.ctx.width is None and len(toks) == N


def feed(w: Width, rates: list[float], stall_ms: float, waste_ms: float, steps: int) -> None:
    """Synthetic measurements: predictions whose rank r hits with `rates[r]`, and decode
    steps whose blocked time per demand read is `stall_ms`, and whose reads cost `waste_ms`
    (readers busy all the time: a read's busy time is all waste)."""
    true = list(range(100, 100 + w.top_k))
    demand = busy = issued = 0.0
    for step in range(steps):
        for i in range(20):  # 20 predictions a step, each rank hitting at its rate
            ranked = [true[0] if i < 20 * p else 200 + r for r, p in enumerate(rates)]
            w.observe(ranked, true)
        demand += 2
        issued += 4
        busy += 4 * waste_ms / 1e3
        w.step(step, 2 * stall_ms / 1e3, 4 * waste_ms / 1e3, int(demand), busy, int(issued))


@pytest.fixture
def info_logs() -> Any:
    log.configure("info")  # the decisions are logged at info
    yield
    log.configure()


def test_auto_follows_the_measured_hit_rates_and_costs(info_logs: None) -> None:
    rates = [0.9, 0.7, 0.55, 0.4, 0.3, 0.2, 0.1, 0.05]
    with capture_logs() as logs:
        w = Width(4, 64, None, room=8, every=4, min_samples=10)
        assert w.now == 4  # K until measured
        # one step in `sample` ranks every scored rank; the others ask the best `now`
        assert w.ask(0) == (8, True) and w.ask(1) == (4, False)
        feed(w, rates, stall_ms=1.0, waste_ms=1.0, steps=5)
    assert w.decisions == 1
    assert w.now == 3  # ranks hitting more than half the time: stall = waste
    assert w.ask(1) == (3, False) and w.ask(w.sample) == (8, True)
    event = [e for e in logs if e["event"] == "prefetch_width"][-1]
    assert event["width"] == 3 and event["hit_rates"][:2] == [0.9, 0.7]
    assert event["stall_ms"] == pytest.approx(1.0) and event["waste_ms"] == pytest.approx(1.0)
    # a demand read stalls 9x what a wasted read costs: ranks up to K hitting > 10% pay;
    # above K a miss also displaces a kept expert (one more stall): they need > 50%
    w = Width(4, 64, None, room=8, every=4, min_samples=10)
    feed(w, rates, stall_ms=9.0, waste_ms=1.0, steps=5)
    assert w.now == 4
    w = Width(4, 64, None, room=8, every=4, min_samples=10)
    feed(w, rates[:4] + [0.6, 0.3], stall_ms=9.0, waste_ms=1.0, steps=5)
    assert w.now == 5
    w = Width(6, 64, None, room=6, every=4, min_samples=10)  # K=6: ranks 5 and 6 are within K
    feed(w, rates, stall_ms=9.0, waste_ms=1.0, steps=5)
    assert w.now == 6
    # reads that cost more than any stall they save: none prefetched
    w = Width(4, 64, None, room=8, every=4, min_samples=10)
    feed(w, [0.6, 0.4, 0.3, 0.2], stall_ms=0.1, waste_ms=5.0, steps=5)
    assert w.now == 0 and w.ask(1) == (0, False)  # nothing predicted but to score


def test_auto_goes_above_k_only_where_the_pool_has_room() -> None:
    rates = [0.95] * 8  # every rank pays
    layers = 6
    base = pool_size(4, layers)  # the plan's pool without a budget: no room
    assert room(base, 4, layers) == 4
    w = Width(4, 64, None, room(base, 4, layers), every=4, min_samples=10)
    feed(w, rates, stall_ms=5.0, waste_ms=1.0, steps=5)
    assert w.now == 4
    more = base + 3 * layers  # a budget's extra slots: 3 more per streamed layer
    w = Width(4, 64, None, room(more, 4, layers), every=4, min_samples=10)
    feed(w, rates, stall_ms=5.0, waste_ms=1.0, steps=5)
    assert w.now == 7
    w = Width(4, 64, None, room(base + 100 * layers, 4, layers), every=4, min_samples=10)
    feed(w, rates, stall_ms=5.0, waste_ms=1.0, steps=5)
    assert w.now == 8  # the ranks scored: 2K


def test_best_width_takes_the_best_prefix() -> None:
    # a later rank that pays alone does not pay for the ones before it
    assert best_width([0.9, 0.2, 0.2, 0.95], 1.0, 1.0, 4, 4) == 1
    assert best_width([0.9, 0.45, 0.45, 0.95], 1.0, 1.0, 4, 4) == 4
    assert best_width([0.9, 0.9], 1.0, 1.0, 1, 4) == 1  # capped
    assert best_width([0.9, 0.6, 0.6], 1.0, 0.0, 3, 1) == 3  # 0.6 > (0 + 1) / (1 + 1)
    assert best_width([0.9, 0.4, 0.4], 1.0, 0.0, 3, 1) == 1


def test_ranked_predictions_come_best_first() -> None:
    import mlx.core as mx

    from edge0.routing.predictors import HeadPredictor

    logits = mx.array([0.1, 3.0, -1.0, 2.0, 0.5, 2.5, -0.2, 1.0])

    class Heads:
        heads: dict[int, Any] = {}  # no parameters (a one-token step compiles its top-k)

        def predict(self, *args: Any) -> mx.array:
            return logits

    pred = object.__new__(HeadPredictor)
    pred.heads, pred.hidden_only = Heads(), True  # type: ignore[assignment]
    pred._compiled = {}
    x = mx.zeros((1, 1, 4))
    assert pred.graph(0, x, x, None, 4, ranked=True).tolist() == [1, 5, 3, 7]  # type: ignore[union-attr]
    assert sorted(pred.graph(0, x, x, None, 4).tolist()) == [1, 3, 5, 7]  # type: ignore[union-attr]
