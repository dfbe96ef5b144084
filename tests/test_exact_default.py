"""Exact unless told otherwise: the default mode follows the heads' validation record, and the
stats line says whether the output is exact."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import structlog
from runtime_helpers import PROMPT

from edge0.routing.prerouter import PrerouterSet
from edge0.routing.validation import Validation
from edge0.runtime.engine.api import Engine

RECORD = {"k": 2, "agreement": 0.875, "kl_mean": 0.05, "recall": 0.6, "tokens": 64}


@pytest.fixture(scope="module")
def layouts(runtime_stores: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same tiny layout three ways: no heads, trained heads, validated heads (K=2)."""
    from edge0.layout.load import load_layout

    root = tmp_path_factory.mktemp("exact")
    bare = runtime_stores["qwen3_moe"]
    out = {"bare": bare}
    for name, record in (("trained", None), ("validated", RECORD)):
        dest = shutil.copytree(bare, root / name)
        heads = PrerouterSet.from_model(load_layout(dest, experts="none").model)
        heads.save(dest)
        config = json.loads((dest / "prerouter.json").read_text())
        config["trained"] = True
        config["info"] = {} if record is None else {"validation": record}
        (dest / "prerouter.json").write_text(json.dumps(config))
        out[name] = dest
    return out


def run(path: Path, **opts: Any) -> tuple[str, Any]:
    async def go() -> tuple[str, Any]:
        async with Engine.open(path, tiers="pread", **opts) as eng:
            stats = None
            async for piece in eng.generate(PROMPT, max_tokens=3, chat=False):
                if not isinstance(piece, str):
                    stats = piece
            return str(eng.options.mode), stats

    return asyncio.run(go())


def test_the_record_decides_the_default(layouts: dict[str, Path]) -> None:
    assert Validation.read(layouts["bare"]) is None
    assert Validation.read(layouts["trained"]) is None  # trained, not validated
    assert Validation.read(layouts["validated"]) == Validation(**RECORD)
    for name in ("bare", "trained"):
        mode, stats = run(layouts[name])
        assert mode == "hint" and stats.line().endswith("| exact"), name
    mode, stats = run(layouts["validated"])
    assert mode == "route"
    assert stats.line().endswith("| approximate (route, agreement 87.5%)")
    assert "mode route, approximate (route, agreement 87.5%)" in stats.summary()
    mode, stats = run(layouts["validated"], top_k=1)  # not the capacity it was validated at
    assert mode == "hint" and stats.exactness == "exact"
    mode, _ = run(layouts["validated"], predictor="init")  # not the heads it was validated on
    assert mode == "hint"


def test_a_record_below_the_floor_keeps_hint(layouts: dict[str, Path], tmp_path: Path) -> None:
    poor = Path(shutil.copytree(layouts["validated"], tmp_path / "poor"))
    config = json.loads((poor / "prerouter.json").read_text())
    config["info"]["validation"]["agreement"] = 0.5
    (poor / "prerouter.json").write_text(json.dumps(config))
    mode, stats = run(poor)
    assert mode == "hint" and stats.exactness == "exact"
    mode, stats = run(poor, mode="route")  # asked for: its record says how close it is
    assert stats.exactness == "approximate (route, agreement 50.0%)"


def test_explicit_route_on_unvalidated_heads_says_so_once(layouts: dict[str, Path]) -> None:
    with structlog.testing.capture_logs() as logs:
        mode, stats = run(layouts["trained"], mode="route")
    warned = [e for e in logs if e["event"] == "route.approximate"]
    assert mode == "route" and len(warned) == 1
    assert stats.exactness == "approximate (route, heads not validated)"
    with structlog.testing.capture_logs() as logs:
        run(layouts["validated"], mode="route")
        run(layouts["bare"], mode="hint")
    assert not [e for e in logs if e["event"] == "route.approximate"]


def test_exact_modes_and_an_unbounded_deadline_are_exact(layouts: dict[str, Path]) -> None:
    for opts in ({"mode": "reactive"}, {"mode": "resident"}):
        assert run(layouts["trained"], **opts)[1].exactness == "exact", opts
    policy = {"mode": "route", "route_policy": "available-first", "route_deadline_ms": float("inf")}
    assert run(layouts["trained"], **policy)[1].exactness == "exact"
