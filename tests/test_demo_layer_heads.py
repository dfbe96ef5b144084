"""The demo ships trained layer-horizon heads: they load, the demo conversion carries them, and
the deadline route policy uses them on the demo by default (the next-router rule without them)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from structlog.testing import capture_logs

from edge0 import log
from edge0.model import demo
from edge0.routing.prerouter import FILES, PrerouterSet
from edge0.runtime.engine.api import Engine

TIERS = "ram:64MiB>pread"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE0_CACHE", str(tmp_path_factory.getbasetemp() / "edge0-cache"))
        return demo.default_model_path()


def test_shipped_layer_heads_load_as_trained_same_token_heads() -> None:
    heads = PrerouterSet.load(demo.TEACHER_DIR, "layer")
    cfg = heads.config
    assert cfg.horizon == "layer" and not cfg.wrap and cfg.trained
    assert cfg.num_experts == 32 and cfg.top_k == 4 and cfg.d_model == 256
    assert heads.target == {n: n + 1 for n in range(7)}  # no wrap-around head
    assert cfg.info["heldout_recall"] > cfg.info["heldout_recall_init"]  # trained, not the rule
    # the token heads beside them are untouched: still the one-token-ahead set
    token = PrerouterSet.load(demo.TEACHER_DIR)
    assert token.config.horizon == "token" and token.config.wrap


def test_demo_conversion_carries_both_head_sets(demo_dir: Path) -> None:
    shipped = {p.name for p in demo._shipped_files()}  # the conversion's cache key
    for horizon in ("token", "layer"):
        for name in FILES[horizon]:
            assert name in shipped, f"{name} is not shipped with the demo"
            assert (demo_dir / name).read_bytes() == (demo.TEACHER_DIR / name).read_bytes()
    assert demo_dir.name == f"demo-student-{demo._fingerprint(demo._shipped_files())}"


async def _policy(path: Path) -> tuple[Any, list[dict[str, Any]]]:
    log.configure("info")  # the choice is logged at info level
    try:
        with capture_logs() as events:
            async with Engine.open(path, tiers=TIERS, route_policy="deadline") as eng:
                policy = eng.setup.ctx.policy
    finally:
        log.configure("warning")  # the tests' level (edge0.log's library default)
    return policy, [e for e in events if e["event"] == "route_policy.layer_heads"]


def test_deadline_policy_uses_the_shipped_layer_heads_on_the_demo(demo_dir: Path) -> None:
    policy, logged = asyncio.run(_policy(demo_dir))
    assert policy is not None and policy.name == "deadline"
    used = policy.layer_heads
    assert used.config.trained and used.config.horizon == "layer"
    shipped = PrerouterSet.load(demo.TEACHER_DIR, "layer")
    for name, value in shipped.parameters_flat().items():
        assert mx.array_equal(used.parameters_flat()[name], value), name
    assert [e["heads"] for e in logged] == ["trained"]


def test_without_layer_heads_the_deadline_policy_falls_back_to_the_rule(
    demo_dir: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "demo"
    shutil.copytree(demo_dir, bare, ignore=shutil.ignore_patterns(*FILES["layer"]))
    policy, logged = asyncio.run(_policy(bare))
    assert not policy.layer_heads.config.trained
    assert [e["heads"] for e in logged] == ["next-router rule"]
