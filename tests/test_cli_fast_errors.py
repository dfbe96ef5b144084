"""Argument errors come before the heavy imports: no MLX, mlx-lm or transformers, well under 1 s.

One child process runs every bad command line in turn through the click entry point
and reports, per line, the exit code, the first stderr line, the seconds it took and
which heavy modules had been imported by then. The time bound is loose (a loaded
2-core machine); the import check is the real guarantee.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("mlx.core", "mlx_lm", "transformers", "torch")
BOUND_S = 3.0  # per command line, the interpreter's own start-up excluded

PROBE = """
import contextlib, io, json, sys, time
cases, HEAVY = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = []
for args in cases:
    err = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(err):
        try:
            from edge0.cli.main import main
            main(args, prog_name="edge0")
            code = 0
        except SystemExit as exc:
            code = exc.code
    seconds = time.perf_counter() - start
    heavy = [m for m in HEAVY if m in sys.modules]
    out.append({"args": args, "code": code, "stderr": err.getvalue(), "s": seconds,
                "heavy": heavy})
print(json.dumps(out))
"""


def _cases(tmp: Path) -> list[list[str]]:
    a_file = tmp / "weights.bin"
    a_file.write_bytes(b"\0")
    empty = tmp / "empty"
    empty.mkdir()
    hf = tmp / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "qwen3_moe"}')
    return [
        ["run", str(tmp / "missing"), "-p", "hi"],
        ["run", str(a_file), "-p", "hi"],
        ["run", str(empty), "-p", "hi"],
        ["run", "-p", "hi", "--tiers", "ram:1GiB>bogus"],
        ["run", "-p", "hi", "--tiers", "ram:lots>pread"],
        ["run", "-p", "hi", "--tiers", "pread>ram:1GiB"],
        ["run", "-p", "hi", "--memory-budget", "3 gigs"],
        ["run", "-p", "hi", "--temp", "nan"],
        ["run", "-p", "hi", "--seed", "-1"],
        ["run", "-p", "hi", "--trace", str(tmp / "no" / "dir" / "t.json")],
        ["run", "-p", "hi", "--stats", "most"],
        ["run", "-p", "hi", "--top-k", "0"],
        ["run", str(hf), "-p", "hi", "--tiers", "pread"],
        ["convert", str(tmp / "missing"), str(tmp / "out")],
        ["convert", str(empty), str(tmp / "out")],
        ["verify", str(tmp / "missing")],
        ["bench", "run", str(tmp / "missing")],
        ["bench", "run", str(hf), "--tiers", "ram:1GiB>bogus"],
        ["bench", "run", str(hf), "--memory-budget", "3 gigs"],
        ["bench", "batch", str(hf), "--tiers", "pread>ram"],
    ]


def test_argument_errors_come_before_heavy_imports(tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(cases), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(cases)
    for r in results:
        line = " ".join(r["args"])
        first = r["stderr"].strip().splitlines()[-1] if r["stderr"].strip() else ""
        assert r["code"] == 2, f"{line}: exit {r['code']}\n{r['stderr']}"
        assert "Traceback" not in r["stderr"], f"{line}\n{r['stderr']}"
        assert first.startswith(("edge0: error: ", "Error: ")), f"{line}\n{r['stderr']}"
        assert r["heavy"] == [], f"{line} imported {r['heavy']} before refusing"
        assert r["s"] < BOUND_S, f"{line} took {r['s']:.2f} s to refuse"


@pytest.mark.parametrize("spec", ["ram:1GiB>bogus", "ram:lots>pread", "pread>ram:1GiB"])
def test_tier_errors_name_the_flag_and_the_spec(tmp_path: Path, spec: str) -> None:
    from click.testing import CliRunner

    from edge0.cli.main import main

    res = CliRunner().invoke(main, ["run", "-p", "hi", "--tiers", spec])
    assert res.exit_code == 2
    assert res.stderr.startswith(f"edge0: error: --tiers {spec!r}: "), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
