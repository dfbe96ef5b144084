"""Per-rank `--memory-budget`: each rank's plan covers its own layers, refuses before loading."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import attrs
import mlx.core as mx
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten
from runtime_helpers import build_store

from edge0.cli.main import main
from edge0.errors import ConfigError
from edge0.layout.manifest import Manifest
from edge0.options.engine import EngineOptions
from edge0.ranks.budget import layer_bytes, rank_plan
from edge0.ranks.plan import balance, plan_split
from edge0.ranks.stage import load_stage
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.slotmem import ALIGN
from edge0.runtime.io.slots import pool_size
from edge0.runtime.plan.footprint import footprint

ROUTE = EngineOptions(mode="route", predictor="init", tiers="pread", top_k=2)
PARTS = ("resident", "resident_experts", "heads", "layers", "kv", "state")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("budget"), "qwen3_5_moe")


@pytest.mark.parametrize(
    "opts", [ROUTE, attrs.evolve(ROUTE, first_layer="wrap"), attrs.evolve(ROUTE, mode="resident")]
)
def test_rank_footprints_add_up_to_one_process(hybrid: Path, opts: EngineOptions) -> None:
    manifest = Manifest.load(hybrid)
    lb = layer_bytes(hybrid, manifest, opts, baseline=100 << 20)
    whole = footprint(hybrid, manifest, opts, 100 << 20)
    assert lb.footprint(range(4), True, True) == whole  # one rank holding every layer
    for ranges in (
        (range(0, 1), range(1, 4)),
        (range(0, 2), range(2, 4)),
        (range(0, 1), range(1, 2), range(2, 3), range(3, 4)),
    ):
        fps = [lb.footprint(r, i == 0, i == len(ranges) - 1) for i, r in enumerate(ranges)]
        for part in PARTS:  # every layer's bytes land on exactly one rank
            assert sum(getattr(f, part) for f in fps) == getattr(whole, part), (part, ranges)
        for f in fps:  # each rank pays its own baseline, working memory and slot size
            assert (f.overhead, f.working, f.slot, f.top_k) == (
                whole.overhead,
                whole.working,
                whole.slot,
                whole.top_k,
            )
    # the split balances exactly the per-rank bytes that vary (baseline etc. are per rank)
    split = plan_split(lb.costs(), 2)
    fixed = [rank_plan(1 << 40, lb, split.ranges, i) for i in range(2)]  # as a rank plans
    got = [  # (the minimum pool: a budget's remainder buys more slots)
        p.resident + p.heads + p.kv + (p.n_slots - p.extra_slots - 2 * whole.top_k) * whole.slot
        if whole.layers
        else p.resident + p.heads + p.kv
        for p in fixed
    ]
    assert got == list(split.cost)


def test_planned_resident_bytes_are_what_each_rank_loads(hybrid: Path) -> None:
    manifest = Manifest.load(hybrid)
    lb = layer_bytes(hybrid, manifest, ROUTE, 0)
    for own, first, last in (
        (range(0, 1), True, False),
        (range(1, 4), False, True),
        (range(1, 3), False, False),
    ):
        stage, _, _ = load_stage(hybrid, manifest, own, first, last, "none", False, lambda m: 0)
        flat = tree_flatten(stage.model.parameters())
        loaded = sum(v.nbytes for _, v in flat if isinstance(v, mx.array))
        assert lb.footprint(own, first, last).resident == loaded, own
        del stage, flat
        gc.collect()


def test_a_budget_one_rank_cannot_hold_names_that_rank_and_the_fix(hybrid: Path) -> None:
    manifest = Manifest.load(hybrid)
    lb = layer_bytes(hybrid, manifest, ROUTE, 50 << 20)
    ranges = (range(0, 1), range(1, 4))
    need = []
    for r in range(2):  # each rank's fixed part: what plan() refuses below
        p = rank_plan(1 << 40, lb, ranges, r)
        pool = max(p.slots - p.extra_slots * lb.fp.slot, ALIGN)  # the minimum pool
        need.append(p.resident + p.heads + pool + p.kv + p.overhead + p.working)
    heavy = max(range(2), key=lambda r: need[r])
    budget = (need[0] + need[1]) // 2  # between the two ranks' needs
    assert need[1 - heavy] <= budget < need[heavy]
    rank_plan(budget, lb, ranges, 1 - heavy)  # the lighter rank fits
    own = ranges[heavy]
    with pytest.raises(ConfigError) as got:
        rank_plan(budget, lb, ranges, heavy)
    msg = str(got.value)
    assert "\n" not in msg
    assert msg.startswith(f"rank {heavy} (layers {own.start}-{own.stop - 1}): --memory-budget")
    assert "raise the budget" in msg and "fewer layers with --layers" in msg
    # a big budget: the minimum slot pool of the rank's own streamed layers, the rest more
    # slots (up to its own records), no RAM cache
    p1 = rank_plan("1GiB", lb, ranges, 1)
    assert p1.n_slots - p1.extra_slots == pool_size(2, 3) and p1.extra_slots > 0
    assert p1.cache == 0


def test_default_split_balances_the_memory_plans(hybrid: Path) -> None:
    manifest = Manifest.load(hybrid)
    lb = layer_bytes(hybrid, manifest, ROUTE, 0)
    split = plan_split(lb.costs(), 2)
    assert split == balance(lb.costs(), 2)
    assert plan_split(lb.costs(), 2, layers="2,2").text() == "2,2"
    # the full-attention layer's KV cache for the planned 4,096 tokens outweighs the rest
    assert lb.kv[3] > 0 and lb.costs()[3] == max(lb.costs()) and split.text() == "3,1"
    # rank 0 holds layer 0's kept experts (--first-layer resident) and the embedding
    assert lb.costs()[0] - lb.costs()[1] == lb.experts[0] + lb.embed - lb.fp.top_k * lb.fp.slot


def test_too_small_a_budget_is_refused_before_any_rank_starts(hybrid: Path) -> None:
    res = CliRunner().invoke(
        main,
        [
            "run",
            str(hybrid),
            "-p",
            "ab",
            "--hosts",
            "2",
            "--memory-budget",
            "1MiB",
            "--max-tokens",
            "2",
        ],
    )
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("edge0: error: rank 0 (layers 0-2): --memory-budget 1 MiB is below")

    async def go() -> None:
        async with Engine.open(hybrid, hosts=2, layers="2,2", memory_budget="1MiB"):
            pass

    with pytest.raises(ConfigError, match=r"^rank 0 \(layers 0-1\)"):
        asyncio.run(go())
