"""Open / generate / close the engine in N fresh processes; count the ones that abort at exit.

A thread that used MLX streams and exits without releasing them aborts the process
about one run in 40 (`terminate called without an active exception`, exit 134 or
SIGABRT). Each cycle here is one subprocess: open a tiny streaming engine, generate
a few tokens, close it, exit.

    .venv/bin/python tools/exit_cycles.py --cycles 200 --jobs 2
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

CYCLE = """
import sys
from edge0.runtime.engine.sync import SyncEngine
with SyncEngine(sys.argv[1], mode=sys.argv[2], tiers="pread") as eng:
    pieces = list(eng.generate([5, 17, 42, 7], max_tokens=4))
assert pieces, "no output"
"""
MODES = ("route", "hint", "reactive", "resident")


def make_store(root: Path) -> Path:
    from edge0.layout.convert import ConvertOptions, convert
    from edge0.synth.tiny import TinySpec, write_checkpoint

    hf = write_checkpoint(TinySpec(model_type="qwen3_moe"), root / "hf")
    convert(hf, root / "e0", ConvertOptions(group_size=32))
    return root / "e0"


def one(store: Path, i: int, code_dir: str | None) -> tuple[int, str]:
    mode = MODES[i % len(MODES)]
    proc = subprocess.run(
        [sys.executable, "-c", CYCLE, str(store), mode],
        cwd=code_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr[-400:]


@click.command()
@click.option("--cycles", default=200, show_default=True, type=click.IntRange(1))
@click.option("--jobs", default=2, show_default=True, type=click.IntRange(1))
@click.option(
    "--store",
    type=click.Path(path_type=Path),
    default=None,
    help="An edge0-layout dir [default: a tiny one built in a temp dir].",
)
@click.option("--code-dir", default=None, help="Run the cycles with the edge0 found in this dir.")
def main(cycles: int, jobs: int, store: Path | None, code_dir: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = store or make_store(Path(tmp))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda i: one(store, i, code_dir), range(cycles)))
        codes = collections.Counter(rc for rc, _ in results)
        aborts = [err for rc, err in results if rc in (134, -6) or "terminate called" in err]
        failures = [err for rc, err in results if rc != 0]
        print(
            json.dumps(
                {
                    "cycles": cycles,
                    "aborts": len(aborts),
                    "nonzero_exits": len(failures),
                    "exit_codes": {str(k): v for k, v in sorted(codes.items())},
                    "seconds": round(time.perf_counter() - t0, 1),
                    "code": code_dir or "installed",
                }
            )
        )
        for err in failures[:3]:
            print("---", err, file=sys.stderr)
        sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
