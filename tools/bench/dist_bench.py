"""Pipeline parallel on one machine: tok/s, per-rank peak RSS and ring cost at 1, 2, 4 ranks.

    .venv/bin/python tools/bench/dist_bench.py MODEL [--ranks 1,2,4] [--tiers pread]
        [--tiers "throttle:bw=400MB/s,lat=200us>pread"] [--mode route] [--k 4]
        [--tokens 16] [--rounds 2] [--first-layer resident] [--memory-budget 2GiB (per rank)]
    [--json out.json] [--md out.md]

Each (tiers, ranks) configuration runs in a fresh process (one ring per process),
configurations interleaved round by round; per configuration: one warm-up request,
one measured request (decode tok/s, rank 0's blocked-load ms/step), every rank's
peak RSS, the bytes each token puts on the ring and the time of an empty trip
around it (ping). Medians over rounds; ratios against 1 rank within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]


async def one(path: str, ranks: int, tiers: str, mode: str, k: int, tokens: int,
              extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    from edge0.dist.launch import node_of
    from edge0.dist.pipeline import gather_stats, ping
    from edge0.runtime.engine.api import Engine
    from edge0.stats import peak_rss_bytes

    opts: dict[str, Any] = dict(mode=mode, top_k=k, tiers=tiers, predictor="init", **extra)
    if ranks > 1:
        opts["hosts"] = ranks
    t0 = time.perf_counter()
    async with Engine.open(path, **opts) as eng:
        opened = time.perf_counter() - t0
        async for _ in eng.tokens(PROMPT, max_tokens=4, stop=False):  # warm-up
            pass
        async for _ in eng.tokens(PROMPT[::-1], max_tokens=tokens, stop=False):
            pass
        st = eng.last_stats
        assert st is not None
        out: dict[str, Any] = dict(ranks=ranks, tiers=tiers, open_s=opened,
                                   decode_tps=st.decode_tps, blocked_ms=st.blocked_ms_per_step,
                                   bytes_per_token=st.bytes_per_token)  # fmt: skip
        if ranks > 1:
            node = node_of(eng)
            stats = await eng._compute.run(lambda: gather_stats(node))
            trips = await eng._compute.run(lambda: ping(node, 50))
            out["peak_rss_mib"] = [s["peak_rss_mib"] for s in stats]
            out["rank_read_mib"] = [s["read_mib"] for s in stats]
            out["rank_cpu_ms"] = [s["cpu_s"] / s["steps"] * 1e3 for s in stats]
            out["rank_wall_ms"] = [s["wall_s"] / s["steps"] * 1e3 for s in stats]
            out["load_read_mib"] = [s["load_read_mib"] for s in stats]  # read while loading
            out["slots"] = [int(s["slots"]) for s in stats]
            out["read_layers"] = [[int(s["read_layer_min"]), int(s["read_layer_max"])]
                                  for s in stats]  # fmt: skip
            out["split"] = [[r.start, r.stop - 1] for r in node.split.ranges]
            plan = eng.setup.memory_plan
            out["plan0"] = None if plan is None else plan.line()
            out["ring_bytes_per_token"] = ranks * node.link.codec.nbytes  # n hops per token
            out["ring_trip_ms"] = statistics.median(trips) * 1e3
        else:
            out["peak_rss_mib"] = [peak_rss_bytes() / 2**20]
            recs = eng.setup.ctx.records[-(len(PROMPT) + tokens - 1) :]
            out["rank_cpu_ms"] = [sum(r.cpu for r in recs) / len(recs) * 1e3]
            out["rank_wall_ms"] = [sum(r.wall for r in recs) / len(recs) * 1e3]
            out["ring_bytes_per_token"] = 0
            out["ring_trip_ms"] = 0.0
            out["load_read_mib"] = [-1.0]  # not measured for one process
            plan = eng.setup.memory_plan
            out["plan0"] = None if plan is None else plan.line()
    return out


def run_one(args: argparse.Namespace, ranks: int, tiers: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, args.model, "--one", str(ranks), "--one-tiers", tiers,
           "--mode", args.mode, "--k", str(args.k), "--tokens", str(args.tokens),
           "--first-layer", args.first_layer]  # fmt: skip
    if args.memory_budget:
        cmd += ["--memory-budget", args.memory_budget]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 and "terminate called" in proc.stderr:  # MLX thread-exit abort
        print("retrying after an MLX abort at exit", file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| tiers | ranks | decode tok/s (median) | vs 1 rank (per-round median) | "
             "peak RSS per rank, MiB | compute-thread CPU ms/step per rank | "
             "blocked ms/step (rank 0) | ring bytes/token | ring trip ms | "
             "ms/token outside the ranks' steps | read while loading per rank, MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| `{r['tiers']}` | {r['ranks']} | {r['decode_tps']:.2f} | {r['ratio']:.2f} | "
            f"{' / '.join(f'{m:.0f}' for m in r['peak_rss_mib'])} | "
            f"{' / '.join(f'{m:.1f}' for m in r['rank_cpu_ms'])} | {r['blocked_ms']:.2f} | "
            f"{r['ring_bytes_per_token']} | {r['ring_trip_ms']:.2f} | {r['outside_ms']:.1f} | "
            f"{' / '.join(f'{m:.0f}' for m in r['raw'][0]['load_read_mib'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--tiers", action="append")
    p.add_argument("--mode", default="route")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--first-layer", default="resident")
    p.add_argument("--memory-budget", help="per rank, e.g. 2GiB")
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--one-tiers", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        extra: dict[str, Any] = dict(first_layer=args.first_layer)
        if args.memory_budget:
            extra["memory_budget"] = args.memory_budget
        res = asyncio.run(one(args.model, args.one, args.one_tiers, args.mode, args.k,
                              args.tokens, extra))  # fmt: skip
        print(json.dumps(res))
        return
    tiers_list = args.tiers or ["pread"]
    ranks_list = [int(r) for r in args.ranks.split(",")]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rnd in range(args.rounds):
        for tiers in tiers_list:
            for ranks in ranks_list:
                res = run_one(args, ranks, tiers)
                runs.setdefault((tiers, ranks), []).append(res)
                print(f"round {rnd} {tiers} ranks={ranks}: {res['decode_tps']:.2f} tok/s "
                      f"rss {res['peak_rss_mib']}", file=sys.stderr, flush=True)  # fmt: skip
    rows = []
    for (tiers, ranks), got in runs.items():
        base = runs[(tiers, ranks_list[0])]
        ratios = [g["decode_tps"] / b["decode_tps"] for g, b in zip(got, base, strict=True)]
        rows.append(dict(
            tiers=tiers, ranks=ranks, rounds=len(got),
            decode_tps=statistics.median(g["decode_tps"] for g in got),
            ratio=statistics.median(ratios),
            peak_rss_mib=[statistics.median(g["peak_rss_mib"][i] for g in got)
                          for i in range(len(got[0]["peak_rss_mib"]))],
            rank_cpu_ms=[statistics.median(g["rank_cpu_ms"][i] for g in got)
                         for i in range(len(got[0]["rank_cpu_ms"]))],
            blocked_ms=statistics.median(g["blocked_ms"] for g in got),
            ring_bytes_per_token=got[0]["ring_bytes_per_token"],
            ring_trip_ms=statistics.median(g["ring_trip_ms"] for g in got),
            # token time minus every rank's own step time: messages, hand-offs, waking up
            outside_ms=statistics.median(1e3 / g["decode_tps"] - sum(g.get("rank_wall_ms", [0]))
                                         for g in got),
            raw=got,
        ))  # fmt: skip
    md = table(rows)
    print(md)
    load = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(dict(command=sys.argv, load=load, rows=rows),
                                              indent=1) + "\n")  # fmt: skip
    if args.md:
        Path(args.md).write_text(
            f"# Pipeline parallel on one machine\n\n`{' '.join(sys.argv)}`\n\n"
            f"Load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n\n{md}\n"
        )


if __name__ == "__main__":
    main()
