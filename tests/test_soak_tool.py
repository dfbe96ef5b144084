"""tools/bench/soak.py: one engine, prompt after prompt; its rows reach --json as they come."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_soak_writes_a_row_per_prompt(runtime_stores: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [
        sys.executable,
        str(ROOT / "tools/bench/soak.py"),
        str(runtime_stores["qwen3_moe"]),
        "--prompts",
        "3",
        "--prompt-len",
        "5",
        "--max-tokens",
        "1",
        "--k",
        "2",
        "--tiers",
        "pread",
        "--json",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["prompt"] for r in rows] == [1, 2, 3]
    assert all(r["hwm"] >= r["rss"] > 0 and r["objects"] > 0 for r in rows)
    assert "second-half slope" in res.stdout and "all prompts" in res.stdout
