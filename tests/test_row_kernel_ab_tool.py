"""tools/bench/row_kernel_ab.py: one row-kernel unit built at two revisions, run side by side."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    cmd = [
        sys.executable,
        str(TOOL),
        "--base",
        "HEAD",
        "--isa",
        "portable",
        "--opt",
        "0",
        "--case",
        "a4:64x256:64",
        "--case",
        "mxfp4:64x256:32",
        "--m",
        "1,3",
        "--footprint",
        "1",
        "--rounds",
        "3",
        "--stretch",
        "1",
        "--json",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["base"] == "HEAD" and len(got["results"]) == 4
    for row in got["results"]:
        assert row["isa"] == "portable" and row["max_rel_diff"] == 0
        assert row["base_gb_per_cpu_s"] > 0 and row["new_gb_per_cpu_s"] > 0
        assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
    assert "new/base" in res.stdout
    tool = load_tool("tools/bench/row_kernel_ab.py")
    head_tree = tool._tree_at("HEAD", tmp_path / "head") / "edge0" / "kernels"
    assert got["base_sources"] == tool.source_digest(head_tree, "portable")
    assert got["new_sources"] == tool.source_digest(ROOT / "edge0" / "kernels", "portable")


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "ab.json"
    cmd = [
        sys.executable,
        str(TOOL),
        "--isa",
        "portable",
        "--opt",
        "0",
        "--footprint",
        "1",
        "--rounds",
        "1",
        "--stretch",
        "1",
        "--json",
        str(out),
        *args,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    return res, (json.loads(out.read_text()) if res.returncode == 0 else {})


def _older_unit(tool: Any, tmp_path: Path) -> str | None:
    """A revision whose portable unit differs from the working tree's, kernel.h the same."""
    files = ["edge0/kernels/src/isa_portable.cpp", "edge0/kernels/src/kernel_impl.h"]
    log = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--format=%H", "-n", "20", "--", *files],
        capture_output=True,
        text=True,
    )
    here = ROOT / "edge0" / "kernels"
    for i, commit in enumerate(log.stdout.split()):
        try:
            tree = tool._tree_at(f"{commit}^", tmp_path / f"t{i}") / "edge0" / "kernels"
        except click.ClickException:  # the commit that made edge0/kernels: no parent tree
            continue
        same_h = (tree / "src" / "kernel.h").read_text() == (here / "src" / "kernel.h").read_text()
        if same_h and tool.source_digest(tree, "portable") != tool.source_digest(here, "portable"):
            return f"{commit}^"
    return None


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("git") is None, reason="no g++/git")
def test_each_side_is_built_from_its_own_tree(tmp_path: Path) -> None:
    tool = load_tool("tools/bench/row_kernel_ab.py")
    base = _older_unit(tool, tmp_path)
    if base is None:
        pytest.skip("no earlier revision of the portable unit with this kernel.h")
    res, got = _run(tmp_path, "--base", base, "--case", "a4:16x128:64", "--m", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    old = tool._tree_at(base, tmp_path / "base") / "edge0" / "kernels"
    assert got["base_sources"] == tool.source_digest(old, "portable")
    assert got["new_sources"] == tool.source_digest(ROOT / "edge0" / "kernels", "portable")
    assert got["base_sources"] != got["new_sources"]


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("git") is None, reason="no g++/git")
def test_the_int8_path_is_timed_on_request(tmp_path: Path) -> None:
    res, got = _run(
        tmp_path,
        "--base",
        "HEAD",
        "--int8",
        "--case",
        "a4:16x96:32",
        "--case",
        "mxfp4:16x128:32",
        "--m",
        "1,3",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert got["int8"] is True and len(got["results"]) == 4
    for row in got["results"]:
        assert row["int8"] is True and row["max_rel_diff"] == 0
        assert row["new_gb_per_cpu_s"] > 0
    assert "mxfp4 int8 16x128" in res.stdout
    res, _ = _run(tmp_path, "--base", "HEAD", "--int8", "--case", "a8:16x128:64")
    assert res.returncode != 0 and "4-bit matrices only" in res.stderr
