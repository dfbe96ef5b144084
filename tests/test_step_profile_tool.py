"""tools/bench/step_profile.py: a decode step split into the model's parts, tokens unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge0.kernels import native

ROOT = Path(__file__).resolve().parents[1]


def test_parts_of_a_hybrid_step(runtime_stores: dict[str, Path], tmp_path: Path) -> None:
    if native.module() is None:
        pytest.skip(f"no native kernels here: {native.status()}")
    out = tmp_path / "profile.json"
    store = runtime_stores["qwen3_5_moe"]  # 4 layers: 3 Gated-DeltaNet, 1 attention, all MoE
    cmd = [sys.executable, str(ROOT / "tools/bench/step_profile.py"), str(store)]
    cmd += ["--mode", "route", "--top-k", "2", "--tokens", "4", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["parts_tokens_equal"] is True  # forcing the evals changes no token
    parts = got["parts"]
    calls = {k: round(v["calls_per_step"]) for k, v in parts.items()}
    core = "GDN: native conv, gates, recurrence, norm"
    assert calls[core] == 3 and "GDN: recurrence" not in calls  # one native node a layer
    assert calls["attention: sdpa"] == 1
    assert calls["MoE: routed experts (int4)"] == 4
    assert calls["output head (int4)"] == 1
    # exclusive times: the parts add up to no more than the steps they were measured in
    total = sum(v["wall_ms_per_step"] for v in parts.values())
    assert 0 < total <= got["parts_step_wall_ms"] * 1.05
    assert got["nodes_per_call"][core] == 1
