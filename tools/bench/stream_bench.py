"""The runtime's Shows benchmark: route (init heads) vs reactive (and hint) when reads ~= compute.

1. Build (once) a synthetic qwen3_moe store (random weights; `--store`, default under the
   cache directory, $EDGE0_CACHE or ~/.cache/edge0;
   d_model 512, 8 MoE layers, 16 experts top-4, expert FFN 512, int4).
2. Calibrate: reactive and route runs over the page cache give decode compute
   ms/step (median) and bytes read per decode step of each mode; the throttle
   bandwidth is set so that per-step reads (`--calibrate-on` route, reactive or
   their mean) take `--io-ratio` x compute.
3. Run the variants interleaved (A B C A B C ...) through `throttle:bw=..,lat=..>pread`,
   report medians and the route/reactive ratio.

Usage: .venv/bin/python tools/bench/stream_bench.py [--store DIR] [--rounds 3] [--tokens 24]
           [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from edge0 import log
from edge0.loop import run
from edge0.model.demo import cache_dir
from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.summary import RunStats

STORE = cache_dir() / "bench" / "stream-bench"  # the default --store
SPEC = dict(
    model_type="qwen3_moe",
    hidden=512,
    layers=8,
    heads=8,
    kv_heads=4,
    head_dim=64,
    experts=16,
    top_k=4,
    moe_ff=512,
    max_positions=1024,
)
VARIANTS = {
    "resident": dict(mode="resident"),
    "reactive": dict(mode="reactive"),
    "route": dict(mode="route", predictor="init"),
    "hint": dict(mode="hint", predictor="init"),
    # first-layer policy variants (default above: the first MoE layer's experts resident)
    "reactive-all": dict(mode="reactive", first_layer="reactive"),
    "route-wrap": dict(mode="route", predictor="init", first_layer="wrap"),
    "route-reactive1": dict(mode="route", predictor="init", first_layer="reactive"),
}
FIELDS = [
    ("decode tok/s", lambda s: s.decode_tps, "{:.2f}"),
    ("blocked ms/step", lambda s: s.blocked_ms_per_step, "{:.1f}"),
    ("compute ms/step", lambda s: s.compute_ms_per_step, "{:.1f}"),
    ("overhead ms/layer", lambda s: s.overhead_ms_per_layer, "{:.3f}"),
    ("overhead CPU ms/layer", lambda s: s.overhead_cpu_ms_per_layer, "{:.3f}"),
    ("overlap eff.", lambda s: s.overlap_efficiency, "{:.2f}"),
    ("MiB read/step", lambda s: s.decode_bytes_per_step / 2**20, "{:.2f}"),
    ("slot hit rate", lambda s: s.slot_hit_rate, "{:.2f}"),
    ("wasted tickets", lambda s: s.tickets_wasted, "{:.0f}"),
    ("loop lag max ms", lambda s: s.loop_max_lag_ms, "{:.1f}"),
    ("loop lag p99 ms", lambda s: s.loop_p99_lag_ms, "{:.1f}"),
]


def build_store(path: Path) -> Path:
    if not (path / "edge0.json").is_file():
        from edge0.layout.convert import ConvertOptions, convert
        from edge0.synth.tiny import TinySpec, write_checkpoint

        print(f"building the benchmark store in {path.parent} ...", file=sys.stderr)
        write_checkpoint(TinySpec(**SPEC), path.parent / "hf")  # type: ignore[arg-type]
        convert(path.parent / "hf", path, ConvertOptions(group_size=64))
    return path


async def one(path: Path, tiers: str, prompt: list[int], tokens: int, **opts: Any) -> RunStats:
    async with Engine.open(path, tiers=tiers, **opts) as eng:
        async for _ in eng.tokens(prompt, max_tokens=tokens, stop=False):
            pass
        assert eng.last_stats is not None
        return eng.last_stats


async def idle_heartbeat(seconds: float = 3.0, period: float = 0.005) -> tuple[float, float]:
    """Max and p99 lag (ms) of a heartbeat on an otherwise idle loop: the machine's own noise."""
    loop = asyncio.get_running_loop()
    lags, end = [], loop.time() + seconds
    while loop.time() < end:
        t0 = loop.time()
        await asyncio.sleep(period)
        lags.append(loop.time() - t0 - period)
    lags.sort()
    return lags[-1] * 1e3, lags[int(0.99 * (len(lags) - 1))] * 1e3


def median_row(runs: list[RunStats]) -> list[float]:
    return [statistics.median(f(s) for s in runs) for _, f, _ in FIELDS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, default=STORE)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--io-ratio", type=float, default=1.0, help="per-step reads / compute")
    ap.add_argument("--lat", default="100us", help="throttle latency per read")
    ap.add_argument(
        "--calibrate-on",
        choices=["route", "reactive", "mean"],
        default="mean",
        help="whose per-step reads the throttle makes equal to compute",
    )
    ap.add_argument("--variants", default="reactive,route,hint,resident")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    log.configure("warning")
    path = build_store(args.store)
    prompt = [3 + (7 * i) % 400 for i in range(8)]
    idle_max, idle_p99 = run(idle_heartbeat())
    print(f"idle event loop (no engine): lag max {idle_max:.1f} ms, p99 {idle_p99:.1f} ms")
    # 1. calibrate over the page cache (no throttle): per-step compute, and per-step reads
    #    of reactive and route (they differ: route stages its predicted sets)
    order = ("reactive", "route", "reactive", "route")
    cal_runs = [run(one(path, "pread", prompt, args.tokens, **VARIANTS[m])) for m in order]
    compute_s = statistics.median(c.compute_ms_per_step for c in cal_runs) / 1e3
    pairs = list(zip(cal_runs, order, strict=True))
    per_mode = {
        m: statistics.mean(c.decode_bytes_per_step for c, n in pairs if n == m)
        for m in ("reactive", "route")
    }
    step_bytes = (
        per_mode[args.calibrate_on]
        if args.calibrate_on in per_mode
        else statistics.mean(per_mode.values())
    )
    bw = step_bytes / (compute_s * args.io_ratio)
    tiers = f"throttle:bw={bw / 1e6:.1f}MB/s,lat={args.lat}>pread"
    print(
        f"calibration: compute {compute_s * 1e3:.1f} ms/step; reads/step reactive "
        f"{per_mode['reactive'] / 2**20:.2f} MiB, route {per_mode['route'] / 2**20:.2f} MiB "
        f"({args.calibrate_on} used) -> tiers {tiers}"
    )
    # 2. interleaved rounds
    names = args.variants.split(",")
    results: dict[str, list[RunStats]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            t0 = time.perf_counter()
            st = run(one(path, tiers, prompt, args.tokens, **VARIANTS[n]))
            results[n].append(st)
            print(
                f"round {r + 1} {n:9s} {st.decode_tps:6.2f} tok/s blocked "
                f"{st.blocked_ms_per_step:6.1f} ms/step ({time.perf_counter() - t0:.1f} s)",
                file=sys.stderr,
            )
    # 3. table of medians
    rows = {n: median_row(results[n]) for n in names}
    print(f"\nmedians of {args.rounds} interleaved rounds, {args.tokens} decode tokens, {tiers}\n")
    print("| variant | " + " | ".join(h for h, _, _ in FIELDS) + " |")
    print("|---|" + "---|" * len(FIELDS))
    for n in names:
        cells = [fmt.format(v) for (_, _, fmt), v in zip(FIELDS, rows[n], strict=True)]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if "route" in rows and "reactive" in rows:
        ratios = [
            a.decode_tps / b.decode_tps
            for a, b in zip(results["route"], results["reactive"], strict=True)
        ]
        print(
            f"\nroute / reactive decode tok/s: median of per-round ratios "
            f"{statistics.median(ratios):.2f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "tiers": tiers,
                    "calibration": [c.to_dict() for c in cal_runs],
                    "runs": {n: [s.to_dict() for s in results[n]] for n in names},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
