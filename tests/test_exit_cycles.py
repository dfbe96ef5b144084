"""No abort at exit: a few open / generate / close cycles in fresh processes all exit 0 (item 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import build_store

TOOL = Path(__file__).parents[1] / "tools" / "exit_cycles.py"


@pytest.mark.slow
def test_engine_processes_exit_cleanly(tmp_path: Path) -> None:
    store = build_store(tmp_path, "qwen3_moe")
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--cycles", "4", "--jobs", "2", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["aborts"] == 0 and report["nonzero_exits"] == 0, proc.stderr
    assert report["exit_codes"] == {"0": 4}
    assert proc.returncode == 0
