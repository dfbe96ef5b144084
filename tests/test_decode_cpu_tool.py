"""tools/bench/decode_cpu.py: native and MLX windows alternate in one process, same tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge0.kernels import native

ROOT = Path(__file__).resolve().parents[1]


def test_windows_alternate_and_the_tokens_match(
    runtime_stores: dict[str, Path], tmp_path: Path
) -> None:
    if native.module() is None:
        pytest.skip(f"no native kernels here: {native.status()}")
    out = tmp_path / "cpu.json"
    tool, store = ROOT / "tools/bench/decode_cpu.py", runtime_stores["qwen3_moe"]
    cmd = [
        sys.executable,
        str(tool),
        str(store),
        "--windows",
        "2",
        "--tokens",
        "4",
        "--json",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert [len(v) for v in got["cpu_ms_per_token"].values()] == [2, 2]
    assert got["tokens_equal"] is True
    # the native path replaces the composed norm/rope/attention/MoE-block nodes
    assert got["nodes_per_token"]["native"] < got["nodes_per_token"]["mlx"]
    assert "tokens: equal on both paths" in res.stdout
