"""tools/bench/row_kernel_ab.py: one row-kernel unit built at two revisions, run side by side."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from tool_helpers import load_tool

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "bench" / "row_kernel_ab.py"


def test_cases_and_unit_flags_are_read_or_refused() -> None:
    tool = load_tool("tools/bench/row_kernel_ab.py")
    assert tool.parse_case("mxfp4:2880x2880:32") == ("mxfp4", 2880, 2880, 32)
    for bad in ("a4:64x100:64", "mxfp4:64x128:64", "a5:8x64:64", "a4:8x64"):
        with pytest.raises(click.BadParameter, match="KIND|group"):
            tool.parse_case(bad)
    cmake = (ROOT / "edge0" / "kernels" / "CMakeLists.txt").read_text()
    assert tool.unit_flags(cmake, "avx512") == ["-mavx512f", "-mfma"]
    assert tool.unit_flags(cmake, "portable") == []
    with pytest.raises(click.ClickException, match="no edge0_isa"):
        tool.unit_flags(cmake, "sve")


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("git") is None, reason="no g++/git")
def test_a_revision_against_itself_gives_equal_outputs(tmp_path: Path) -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    out = tmp_path / "ab.json"
    cmd = [sys.executable, str(TOOL), "--base", "HEAD", "--isa", "portable", "--opt", "0",
           "--case", "a4:64x256:64", "--case", "mxfp4:64x256:32", "--m", "1,3",
           "--footprint", "1", "--rounds", "3", "--stretch", "1", "--json", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["base"] == "HEAD" and len(got["results"]) == 4
    for row in got["results"]:
        assert row["isa"] == "portable" and row["max_rel_diff"] == 0
        assert row["base_gb_per_cpu_s"] > 0 and row["new_gb_per_cpu_s"] > 0
        assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
    assert "new/base" in res.stdout
