"""The slot pool with the records' bf16 scales kept against a checkout that widens them into a
float32 sidecar, interleaved: slots held, reads a token, blocked and compute ms/step, tok/s,
load average (docs/benchmarks/budget.md, "The slot pool at the checkpoint's scale dtype").

    flock LOCK .venv/bin/python docs/benchmarks/scripts/slot_dtype.py --base OTHER_CHECKOUT \\
        --demo DEMO --q35 Q35 --demo-budget 176MiB --rounds 2 --json OUT.json

Each run is `python -m edge0 bench ...` started inside its checkout (so `python -m` imports
that checkout; OTHER_CHECKOUT needs the built extension in its edge0/kernels/): on the demo,
`bench run --mode hint,route --memory-budget DEMO_BUDGET`; on the 35B shape, `bench budget
--budgets 3GiB --mode route --top-k 4 --first-layer wrap --tokens 32 --prompts 1 --tiers
direct` inside `tools/memcap.py --limit 3GiB`. Round r runs base then this when r is odd,
this then base when it is even. `--run-lines` instead runs `edge0 run DEMO --mode hint
--memory-budget DEMO_BUDGET` once in each checkout and keeps what it prints (the plan's line
first).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[3]
SLOTS = re.compile(r"slots (\d+) \((\d+) slots\)")
KEYS = ("decode_tps", "compute_ms_per_step", "blocked_ms_per_step", "bytes_per_token")


def _run(tree: Path, cmd: list[str], out: Path) -> dict[str, Any]:
    """`cmd` with `tree` as its working directory; its JSON, load averages and wall time."""
    load0, t0 = os.getloadavg(), time.time()
    got = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=3600)
    load1 = os.getloadavg()
    return {
        "exit": got.returncode,
        "stderr_tail": got.stderr[-2000:] if got.returncode else "",
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in load1],
        "wall_s": round(time.time() - t0, 1),
        "report": json.loads(out.read_text()) if out.exists() else None,
    }


def _plan(line: str | None) -> dict[str, int]:
    m = SLOTS.search(line or "")
    return {"slots_mib": int(m.group(1)), "n_slots": int(m.group(2))} if m else {}


def demo(tree: Path, model: str, budget: str, tmp: Path) -> dict[str, Any]:
    out = tmp / "demo.json"
    cmd = [sys.executable, "-m", "edge0", "bench", "run", model, "--mode", "hint,route"]
    cmd += ["--memory-budget", budget, "--repeats", "1", "--prompts", "2", "--tokens", "32"]
    got = _run(tree, [*cmd, "--json", str(out)], out)
    rows = {}
    for v in (got.pop("report") or {}).get("variants", []):
        run = (v.get("runs") or [{}])[0]
        median = v.get("median") or {}
        rows[v["label"]] = {
            **{k: median.get(k) for k in KEYS},
            **_plan(run.get("memory_plan")),
            "memory_plan": run.get("memory_plan"),
            "errors": v.get("errors", []),
        }
    return {**got, "variants": rows}


def q35(tree: Path, model: str, tmp: Path) -> dict[str, Any]:
    out = tmp / "q35.json"
    inner = [sys.executable, "-m", "edge0", "bench", "budget", model, "--budgets", "3GiB"]
    inner += ["--mode", "route", "--top-k", "4", "--first-layer", "wrap", "--tokens", "32"]
    inner += ["--prompts", "1", "--tiers", "direct", "--json", str(out)]
    cmd = [sys.executable, "tools/memcap.py", "--limit", "3GiB", "--", *inner]
    got = _run(tree, cmd, out)
    report = got.pop("report")
    rows = report if isinstance(report, list) else (report or {}).get("rows", [])
    row = rows[0] if rows else {}
    plans = row.get("memory_plans") or [None]
    return {
        **got,
        **{k: row.get(k) for k in (*KEYS, "peak_rss_bytes", "cgroup_peak_bytes")},
        **_plan(plans[0]),
        "memory_plan": plans[0],
        "errors": row.get("errors", []),
    }


def run_lines_of(tree: Path, model: str, budget: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "edge0", "run", model, "-p", "def parse(s):", "--temp", "0"]
    cmd += ["--max-tokens", "32", "--mode", "hint", "--memory-budget", budget]
    load0 = os.getloadavg()
    got = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=600)
    lines = [x for x in (got.stdout + got.stderr).splitlines() if "memory budget" in x or "|" in x]
    return {"exit": got.returncode, "load_before": [round(x, 2) for x in load0], "lines": lines}


@click.command()
@click.option("--base", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--demo", "demo_model", required=True, help="The demo's edge0 layout.")
@click.option("--q35", "q35_model", default=None, help="The 35B shape (edge0 synth).")
@click.option("--demo-budget", default="176MiB", show_default=True)
@click.option("--rounds", default=2, show_default=True)
@click.option("--run-lines", is_flag=True, help="Only `edge0 run`'s lines, once a checkout.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), required=True)
def main(
    base: str,
    demo_model: str,
    q35_model: str | None,
    demo_budget: str,
    rounds: int,
    run_lines: bool,
    json_out: str,
) -> None:
    trees = {"base": Path(base).resolve(), "this": ROOT}
    if run_lines:
        got = {k: run_lines_of(tree, demo_model, demo_budget) for k, tree in trees.items()}
        Path(json_out).write_text(json.dumps({"run": got}, indent=1))
        return
    runs: list[dict[str, Any]] = []
    for r in range(1, rounds + 1):
        order = ("base", "this") if r % 2 else ("this", "base")
        for which in order:
            with tempfile.TemporaryDirectory(prefix="edge0-slotdtype-") as tmp:
                one = {"round": r, "tree": which}
                runs.append(
                    {
                        **one,
                        "model": "demo",
                        **demo(trees[which], demo_model, demo_budget, Path(tmp)),
                    }
                )
                print(json.dumps(runs[-1])[:400], flush=True)
                if q35_model:
                    runs.append({**one, "model": "q35", **q35(trees[which], q35_model, Path(tmp))})
                    print(json.dumps(runs[-1])[:400], flush=True)
            Path(json_out).write_text(json.dumps({"runs": runs}, indent=1))


if __name__ == "__main__":
    main()
