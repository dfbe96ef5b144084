"""Route policies: exact with an unbounded deadline, predicted = today's route, no waiting."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from runtime_helpers import PROMPT, MockTier, build_store

from edge0.cli.main import main
from edge0.errors import ConfigError
from edge0.layout.manifest import Manifest
from edge0.options.engine import EngineOptions
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.tickets import DEMAND
from edge0.storage.tier import ExpertKey

FAMILIES = ["qwen3_moe", "qwen3_5_moe"]
N = 10


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("policy-stores")
    return {mt: build_store(root, mt) for mt in FAMILIES}


async def _decode(path: Path, warm_cache: bool = False, **opts: Any) -> tuple[list[int], Any]:
    opts.setdefault("tiers", MockTier(path))
    async with Engine.open(path, **opts) as eng:
        if warm_cache:  # every record in the RAM tier before the request
            m = Manifest.load(path)
            keys = [ExpertKey(i, e) for i in m.moe_layers for e in range(m.n_experts)]
            await eng.setup.tier.prefetch(keys, m.record_size)  # type: ignore[union-attr]
        toks = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]
        return toks, eng


def decode(path: Path, **opts: Any) -> tuple[list[int], Any]:
    return asyncio.run(_decode(path, **opts))


def decode_reads(eng: Any) -> list[dict[str, Any]]:
    """The reads of the request's decode steps (from the trace)."""
    steps = {r.step for r in eng.setup.ctx.records if not r.prefill}
    reads = [e["args"] for e in eng.setup.tracer.events if e.get("cat", "").startswith("read.")]
    return [r for r in reads if r["step"] in steps]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("policy", ["available-first", "deadline"])
@pytest.mark.parametrize("k", [None, 1])
def test_unbounded_deadline_decodes_resident_tokens(
    stores: dict[str, Path], family: str, policy: str, k: int | None
) -> None:
    path = stores[family]
    ref, _ = decode(path, mode="resident", top_k=k)
    got, eng = decode(
        path,
        mode="route",
        predictor="init",
        top_k=k,
        route_policy=policy,
        route_deadline_ms=math.inf,
    )
    assert got == ref
    assert eng.setup.ctx.routed_by_prediction > 0  # the policy chose at every routed layer
    assert eng.last_stats.route_recall == 1.0


@pytest.mark.parametrize("policy", ["available-first", "deadline"])
def test_a_long_finite_deadline_waits_for_the_true_experts(
    stores: dict[str, Path], policy: str, tmp_path: Path
) -> None:
    """No RAM tier: the true experts that are not staged are demand-read (fetch_within) and
    all arrive within the 30 s deadline, so the routing is the true top-K again."""
    path = stores["qwen3_moe"]
    ref, _ = decode(path, mode="resident", top_k=1)
    got, eng = decode(
        path,
        mode="route",
        predictor="temporal",
        top_k=1,
        route_policy=policy,
        route_deadline_ms=30_000.0,
        trace=tmp_path / "t.json",
    )
    assert got == ref
    assert any(r["kind"] == DEMAND for r in decode_reads(eng))  # the temporal guess missed


def test_everything_in_ram_is_servable_so_available_first_sync_is_exact_at_deadline_zero(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    path = stores["qwen3_5_moe"]
    ref, _ = decode(path, mode="resident", top_k=1)
    got, eng = decode(
        path,
        warm_cache=True,
        mode="route",
        predictor="temporal",
        top_k=1,
        tiers="ram:64MiB>pread",
        route_policy="available-first-sync",
        route_deadline_ms=0.0,
        trace=tmp_path / "t.json",
    )
    assert got == ref
    assert eng.last_stats.route_recall == 1.0
    # the cached experts were copied into slots on the compute thread: no read was queued
    assert not any(r["kind"] == DEMAND for r in decode_reads(eng))


@pytest.mark.parametrize("policy", ["available-first", "available-first-sync", "deadline"])
def test_deadline_zero_never_reads_on_demand(
    stores: dict[str, Path], policy: str, tmp_path: Path
) -> None:
    """Without a cache, at deadline 0 compute runs what is staged or predicted: it never asks
    for a read the prediction (or the deadline policy's lead fetch) did not start."""
    path = stores["qwen3_moe"]
    got, eng = decode(
        path,
        mode="route",
        predictor="temporal",
        top_k=2,
        route_policy=policy,
        trace=tmp_path / "t.json",
    )
    assert len(got) == N
    reads = decode_reads(eng)
    assert reads and not any(r["kind"] == DEMAND for r in reads)
    stats, routed = eng.last_stats, len(eng.setup.manifest.moe_layers) - 1  # first: resident
    assert stats.route_policy == policy and stats.recall_slots == 2 * (N - 1) * routed
    assert stats.lead_reads == 0 or policy == "deadline"


def test_predicted_is_todays_route(stores: dict[str, Path]) -> None:
    path = stores["qwen3_5_moe"]
    ref, _ = decode(path, mode="route", predictor="init", top_k=1)
    got, eng = decode(path, mode="route", predictor="init", top_k=1, route_policy="predicted")
    assert got == ref
    assert eng.setup.ctx.policy is None  # the block never reads the router on the host
    assert eng.last_stats.route_recall is None  # ... so the true sets are not known
    _, eng = decode(path, mode="route", predictor="init", top_k=1, record_routing=True)
    assert eng.last_stats.route_recall is not None and 0 <= eng.last_stats.route_recall <= 1


@pytest.mark.parametrize(
    "opts, needle",
    [
        ({"route_policy": "greedy"}, "unknown route policy"),
        ({"route_policy": "deadline", "route_deadline_ms": -1.0}, "--route-deadline-ms"),
        ({"route_policy": "deadline", "route_deadline_ms": math.nan}, "--route-deadline-ms"),
        ({"route_policy": "available-first", "mode": "hint"}, "--mode route"),
        ({"route_policy": "available-first", "hosts": 2}, "--hosts"),
        ({"route_policy": "deadline", "max_batch": 2}, "--max-batch 2"),
    ],
)
def test_bad_policy_options(opts: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        EngineOptions(**opts).check()


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--mode", "hint", "--route-policy", "deadline"], "--mode route"),
        (["--route-policy", "deadline", "--route-deadline-ms", "nan"], "--route-deadline-ms"),
        (["--mode", "resident", "--route-policy", "deadline"], "--route-policy"),
    ],
)
def test_cli_refuses_bad_policy_flags(
    stores: dict[str, Path], flags: list[str], needle: str
) -> None:
    res = CliRunner().invoke(
        main, ["run", str(stores["qwen3_moe"]), "-p", "hi", "--max-tokens", "2", *flags]
    )
    assert res.exit_code == 2, res.output
    assert res.output.startswith("edge0: error: ") and needle in res.output, res.output


def test_teacher_forced_eval_of_exact_routing_matches_the_parallel_forward(
    stores: dict[str, Path],
) -> None:
    """edge0.eval.policy: the engine's teacher-forced decode logits equal one parallel forward
    of the same int4 model when the routing is exact (resident, or a policy at deadline inf)."""
    import numpy as np

    from edge0.eval.policy import PolicyVariant, evaluate_policy, teacher_logits, variants_for
    from edge0.layout.load import load_layout

    path = stores["qwen3_moe"]
    windows = np.array([[5, 17, 42, 7, 99, 3, 8, 11, 12, 13, 14, 15]], dtype=np.int32)
    logits = teacher_logits(load_layout(path, experts="resident").model, windows)
    top_k = int(Manifest.load(path).config["num_experts_per_tok"])
    rows = [
        asyncio.run(evaluate_policy(path, v, logits, windows, 4, "pread"))
        for v in variants_for(["predicted"], [top_k], None)
    ]
    assert [r["variant"] for r in rows] == ["resident", "exact (deadline inf)", "predicted"]
    for r in rows[:2]:
        assert r["tokens"] == 7 and r["kl_mean"] < 1e-5 and r["top1_agree"] == 1.0, r
    assert rows[1]["route_recall"] == 1.0
    assert rows[2]["route_recall"] is not None and rows[2]["kl_mean"] >= 0
    assert PolicyVariant("route", 2, "deadline", 3.0).label == "deadline 3ms"


def test_bench_reports_each_policy_over_predicted_per_round() -> None:
    from edge0.bench.run import Variant, policy_ratios, ratio_lines

    spec = "ram:8MiB>pread"
    pred, dev = Variant("route", 2, spec), Variant("route", 2, spec, policy="available-first")
    other_k = Variant("route", 4, spec, policy="available-first")  # no predicted at K=4

    def runs(*tps: float) -> list[dict[str, Any]]:
        return [{"summary": {"decode_tps": t, "cpu_ms_per_step": 10.0}} for t in tps]

    got = policy_ratios(
        [pred, dev, other_k], {pred.label: runs(50, 40, 60), dev.label: runs(48, 40, 30)}
    )
    tps = [r for r in got if r.get("key") is None]
    assert [r["variant"] for r in tps] == [dev.label] and tps[0]["over"] == pred.label
    assert tps[0]["per_round"] == [0.96, 1.0, 0.5] and tps[0]["median"] == 0.96
    assert [r["median"] for r in got if r.get("key") == "cpu_ms_per_step"] == [1.0]
    assert "0.96x decode tok/s" in ratio_lines(got) and "process CPU ms/step" in ratio_lines(got)
