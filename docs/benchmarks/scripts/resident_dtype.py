"""`resident` mode of one checkout against another, interleaved, each run in a memory cgroup:
peak RSS, load time, decode tok/s, process CPU and the resident expert stacks' scale dtype
(docs/benchmarks/budget.md, "Resident mode at the checkpoint's scale dtype").

    flock LOCK .venv/bin/python docs/benchmarks/scripts/resident_dtype.py MODEL \\
        --base OTHER_CHECKOUT --rounds 3 --tokens 16 --limit 4GiB --json OUT.json

Each run is `tools/memcap.py --limit LIMIT -- python THIS one MODEL TOKENS` with PYTHONPATH at
the checkout (OTHER_CHECKOUT needs the built extension in its edge0/kernels/). `--only this`
or `--only base` runs one checkout alone (a model one of them cannot load within the limit).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[3]
PROMPT = "The river carried small boats of grain down to the market town"


async def one(model: str, tokens: int) -> dict[str, Any]:
    """One process: open `model` resident, decode `tokens` greedy tokens once."""
    from mlx.utils import tree_flatten

    from edge0.runtime.engine.api import Engine

    t0 = time.perf_counter()
    async with Engine.open(model, mode="resident") as eng:
        load_s = time.perf_counter() - t0
        params = tree_flatten(eng.setup.model.parameters())
        dtypes = sorted(
            {str(v.dtype) for k, v in params if k.endswith("switch_mlp.up_proj.scales")}
        )
        stacks = sum(int(v.nbytes) for k, v in params if ".switch_mlp." in k)
        ids = list(eng.tokenizer.encode(PROMPT))
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        toks = [t async for t in eng.tokens(ids, max_tokens=tokens, stop=False)]
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        st = eng.last_stats
        assert st is not None
    return {
        "tokens": toks,
        "load_s": round(load_s, 2),
        "decode_tps": st.decode_tps,
        "request_cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2),
        "scale_dtypes": dtypes,
        "expert_stack_mib": round(stacks / 2**20, 1),
    }


def run(tree: Path, model: str, tokens: int, limit: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as cap:
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "tools" / "memcap.py"),
                "--limit",
                limit,
                "--json",
                cap.name,
                "--",
                sys.executable,
                str(Path(__file__).resolve()),
                "one",
                model,
                str(tokens),
            ],
            cwd=tree,
            env=dict(os.environ, PYTHONPATH=str(tree)),
            capture_output=True,
            text=True,
        )
        capped = json.loads(Path(cap.name).read_text() or "{}")
    lines = proc.stdout.strip().splitlines()
    got = json.loads(lines[-1]) if proc.returncode == 0 and lines else {}
    return {
        "exit": proc.returncode,
        "peak_rss_mib": round(capped.get("peak_rss", 0) / 2**20, 1),
        "cgroup_peak_mib": round(capped.get("peak_usage", 0) / 2**20, 1),
        "oom_kills": capped.get("oom_kills"),
        "error": proc.stderr.strip()[-400:] if proc.returncode else "",
        **got,
    }


@click.command()
@click.argument("model")
@click.option("--base", type=click.Path(exists=True, file_okay=False), help="The other checkout.")
@click.option("--rounds", default=3, show_default=True)
@click.option("--tokens", default=16, show_default=True)
@click.option("--limit", default="4GiB", show_default=True, help="The cgroup's memory cap.")
@click.option("--only", type=click.Choice(["both", "this", "base"]), default="both")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def main(
    model: str,
    base: str | None,
    rounds: int,
    tokens: int,
    limit: str,
    only: str,
    json_out: str | None,
) -> None:
    if base is None and only != "this":
        raise click.UsageError("give --base (or --only this)")
    trees = {"base": Path(base or ""), "this": ROOT}
    trees = trees if only == "both" else {only: trees[only]}
    rows = []
    for r in range(1, rounds + 1):
        for name, tree in trees.items():
            row = {"round": r, "variant": name, "limit": limit}
            row["load_before"] = round(os.getloadavg()[0], 2)
            row.update(run(tree.resolve(), str(Path(model).resolve()), tokens, limit))
            row["load_after"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            click.echo(json.dumps({k: v for k, v in row.items() if k != "tokens"}))
    if json_out:
        Path(json_out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["one"]:  # the measured process, inside the cgroup
        print(json.dumps(asyncio.run(one(sys.argv[2], int(sys.argv[3])))))
    else:
        main()
