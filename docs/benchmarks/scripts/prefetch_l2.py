"""The int4 row kernels prefetching into L2 against a checkout that prefetches into L1,
interleaved: one kernel call's weight stream from DRAM (GB/s by shape, ISA unit and input
rows), and the 35B shape's decode step inside a 3 GiB cgroup (docs/benchmarks/kernels.md,
"Prefetch into L2").

    flock LOCK .venv/bin/python docs/benchmarks/scripts/prefetch_l2.py --base OTHER_CHECKOUT \\
        --q35 Q35 --rounds 3 --json OUT.json

OTHER_CHECKOUT needs its built extension in edge0/kernels/. Each measurement runs in its own
process started inside its checkout, so that it imports that checkout's kernels: the stream
part is this file with `--stream` (one MLX array per projection, ~1 GiB of them in all, each
called once a pass so that every weight comes from DRAM; the median pass of four after one
warm-up), the 35B part `python -m edge0 bench budget Q35 --budgets 3GiB --mode route
--top-k 4 --first-layer wrap --tokens 32 --prompts 1 --tiers direct` inside
`tools/memcap.py --limit 3GiB` (slot_dtype.py's runner). Round r runs base first when r is
odd, this checkout first when it is even.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slot_dtype import KEYS, ROOT, q35  # noqa: E402

# the 35B shape's int4 projections (rows x cols): Gated-DeltaNet's qkv, an expert's gate/up and
# down, the attention output; the output head has the first one's 2,048 columns
SHAPES = ((8192, 2048), (512, 2048), (2048, 512), (2048, 4096))
STREAM_BYTES = 1 << 30


def stream(units: tuple[str, ...], rows: tuple[int, ...]) -> dict[str, float]:
    """GB/s of int4 g64 weights (bf16 scales and biases counted) per unit, input rows and
    shape, one kernel thread, in this process (the working directory's checkout)."""
    sys.path.insert(0, os.getcwd())
    import mlx.core as mx

    from edge0.kernels import native

    mod = native.module()
    if mod is None:
        raise SystemExit("the native extension is not built in this checkout")
    mod.set_threads(1)
    out: dict[str, float] = {}
    with mx.stream(mx.cpu):
        for n, k in SHAPES:
            count = max(1, STREAM_BYTES // (n * k // 2))
            mats = [
                (
                    mx.random.randint(0, 2**31, (n, k // 8)).astype(mx.uint32),
                    (mx.random.uniform(shape=(n, k // 64)) * 0.01).astype(mx.bfloat16),
                    (mx.random.uniform(shape=(n, k // 64)) * 0.01).astype(mx.bfloat16),
                )
                for _ in range(count)
            ]
            mx.eval(mats)
            gb = count * n * k * (0.5 + 4 / 64) / 1e9
            for unit in units:
                mod.use_isa(unit)
                for m in rows:
                    x = mx.random.normal((m, k))
                    mx.eval(x)
                    times = []
                    for _ in range(5):
                        t0 = time.perf_counter()
                        mx.eval([mod.qmm(x, q, s, b, 64, 4, "affine") for q, s, b in mats])
                        times.append(time.perf_counter() - t0)
                    out[f"{unit} M={m} {n}x{k}"] = round(gb / statistics.median(times[1:]), 2)
            del mats
    return out


def stream_in(tree: Path, units: str, rows: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stream", "--units", units]
    load0 = os.getloadavg()
    got = subprocess.run(
        [*cmd, "--rows", rows], cwd=tree, capture_output=True, text=True, timeout=1800
    )
    return {
        "exit": got.returncode,
        "stderr_tail": got.stderr[-2000:] if got.returncode else "",
        "load_before": [round(x, 2) for x in load0],
        "gbps": json.loads(got.stdout.splitlines()[-1]) if got.returncode == 0 else {},
    }


@click.command()
@click.option("--base", type=click.Path(exists=True, file_okay=False), default=None)
@click.option("--q35", "q35_model", default=None, help="The 35B shape (edge0 synth).")
@click.option("--rounds", default=3, show_default=True)
@click.option("--units", default="avx512,avx2", show_default=True, help="ISA units to time.")
@click.option("--rows", default="1,16", show_default=True, help="Input rows to time.")
@click.option("--stream", "stream_only", is_flag=True, help="Only time the stream, here.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def main(
    base: str | None,
    q35_model: str | None,
    rounds: int,
    units: str,
    rows: str,
    stream_only: bool,
    json_out: str | None,
) -> None:
    if stream_only:
        unit_names = tuple(u for u in units.split(",") if u)
        print(json.dumps(stream(unit_names, tuple(int(m) for m in rows.split(",")))))
        return
    if base is None or json_out is None:
        raise click.UsageError("--base and --json are needed (or --stream)")
    trees = {"base": Path(base).resolve(), "this": ROOT}
    runs: list[dict[str, Any]] = []
    for r in range(1, rounds + 1):
        order = ("base", "this") if r % 2 else ("this", "base")
        for which in order:
            runs.append({"round": r, "tree": which, "part": "stream"})
            runs[-1].update(stream_in(trees[which], units, rows))
            print(json.dumps(runs[-1])[:400], flush=True)
            if q35_model:
                with tempfile.TemporaryDirectory(prefix="edge0-prefetch-") as tmp:
                    got = q35(trees[which], q35_model, Path(tmp))
                runs.append({"round": r, "tree": which, "part": "q35", **got})
                print(json.dumps({k: runs[-1].get(k) for k in ("tree", *KEYS)}), flush=True)
            Path(json_out).write_text(json.dumps({"runs": runs}, indent=1))


if __name__ == "__main__":
    main()
