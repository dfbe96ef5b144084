"""Pipeline parallel on one machine: tok/s, per-rank peak RSS and ring cost at 1, 2, 4 ranks.

    .venv/bin/python tools/bench/dist_bench.py MODEL [--ranks 1,2,4] [--tiers pread]
        [--tiers "throttle:bw=400MB/s,lat=200us>pread"] [--mode route] [--k 4]
        [--tokens 16] [--rounds 2] [--first-layer resident] [--memory-budget 2GiB (per rank)]
        [--memory-budget-one 3GiB (1 rank)]
        [--layers 6,14,14,6] [--net loopback] [--net 1gbit] [--net 10gbit]
    [--json out.json] [--md out.md]

Each (tiers, net, ranks) configuration runs in a fresh process (one ring per process),
configurations interleaved round by round; per configuration: one warm-up request,
one measured request (decode tok/s, rank 0's blocked-load ms/step, its tokens), every
rank's peak RSS, the bytes each token puts on the ring and the time of an empty trip
around it (ping). Medians over rounds; ratios against 1 rank within each round; whether
every run's tokens equal the first 1-rank run's.

`--net loopback` (the default) runs the ranks as local processes on 127.0.0.1; a tbf
rate (`1gbit`, `10gbit`, or `none` for unshaped links) runs each rank in its own network
namespace behind a bridge, links shaped to that rate (tools/netns_ranks.py; needs root),
the ring over the namespaces' addresses only. 1 rank runs once per round whatever the nets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]


async def one(path: str, ranks: int, tiers: str, mode: str, k: int, tokens: int,
              extra: dict[str, Any], hosts: str | None = None) -> dict[str, Any]:  # fmt: skip
    from edge0.dist.launch import node_of
    from edge0.dist.pipeline import gather_stats, ping
    from edge0.runtime.engine.api import Engine
    from edge0.stats import peak_rss_bytes

    opts: dict[str, Any] = dict(mode=mode, top_k=k, tiers=tiers, predictor="init", **extra)
    if ranks > 1:
        opts["hosts"] = hosts or ranks
    t0 = time.perf_counter()
    async with Engine.open(path, **opts) as eng:
        opened = time.perf_counter() - t0
        async for _ in eng.tokens(PROMPT, max_tokens=4, stop=False):  # warm-up
            pass
        got = [t async for t in eng.tokens(PROMPT[::-1], max_tokens=tokens, stop=False)]
        st = eng.last_stats
        assert st is not None
        out: dict[str, Any] = dict(ranks=ranks, tiers=tiers, open_s=opened,
                                   decode_tps=st.decode_tps, blocked_ms=st.blocked_ms_per_step,
                                   bytes_per_token=st.bytes_per_token, tokens=got)  # fmt: skip
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


@contextlib.contextmanager
def held(lock: str | None) -> Iterator[None]:
    """An exclusive flock on `lock` (a file shared by benchmarks) for one configuration."""
    if lock is None:
        yield
        return
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_one(args: argparse.Namespace, ranks: int, tiers: str, net: str,
            ns: Any = None) -> dict[str, Any]:  # fmt: skip
    cmd = [sys.executable, __file__, args.model, "--one", str(ranks), "--one-tiers", tiers,
           "--mode", args.mode, "--k", str(args.k), "--tokens", str(args.tokens),
           "--first-layer", args.first_layer]  # fmt: skip
    budget = args.memory_budget_one if ranks == 1 and args.memory_budget_one else args.memory_budget
    if budget:
        cmd += ["--memory-budget", budget]
    if args.layers and len(args.layers.split(",")) == ranks:
        cmd += ["--layers", args.layers]
    env = None
    if ns is not None and ranks > 1:  # rank 0 in the first namespace, the others in theirs
        ns.shape(net)
        cmd = ns.exec_argv(0, [*cmd, "--one-hosts", str(ns.hosts_for(ranks))])
        env = ns.env()
    with held(args.lock):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        if proc.returncode != 0 and "terminate called" in proc.stderr:  # MLX thread-exit abort
            print("retrying after an MLX abort at exit", file=sys.stderr)
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=env)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    got["net"] = net if ranks > 1 else "-"
    got["load"] = os.getloadavg()[0]
    if ns is not None and ranks > 1:
        got["link"] = dict(rate=ns.rate, burst=ns.burst)
    return got


def summary(runs: dict[tuple[str, str, int], list[dict[str, Any]]], key: tuple[str, str, int],
            ranks_list: list[int]) -> dict[str, Any]:  # fmt: skip
    """One configuration's medians; ratios against the base rank count's run of each round."""
    tiers, net, ranks = key
    got = runs[key]
    base = runs.get((tiers, "-" if ranks_list[0] == 1 else net, ranks_list[0]), got)
    ratios = [g["decode_tps"] / b["decode_tps"] for g, b in zip(got, base, strict=False)]
    want = base[0]["tokens"]
    return dict(
        tiers=tiers, net=net, ranks=ranks, rounds=len(got),
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
        same_tokens=all(g["tokens"] == want for g in got),
        raw=got,
    )  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| tiers | net | ranks | decode tok/s (median) | vs 1 rank (per-round median) | "
             "peak RSS per rank, MiB | compute-thread CPU ms/step per rank | "
             "blocked ms/step (rank 0) | ring bytes/token | ring trip ms | "
             "ms/token outside the ranks' steps | read while loading per rank, MiB | "
             "tokens = 1 rank's |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| `{r['tiers']}` | {r['net']} | {r['ranks']} | {r['decode_tps']:.3f} | "
            f"{r['ratio']:.2f} | "
            f"{' / '.join(f'{m:.0f}' for m in r['peak_rss_mib'])} | "
            f"{' / '.join(f'{m:.1f}' for m in r['rank_cpu_ms'])} | {r['blocked_ms']:.2f} | "
            f"{r['ring_bytes_per_token']} | {r['ring_trip_ms']:.2f} | {r['outside_ms']:.1f} | "
            f"{' / '.join(f'{m:.0f}' for m in r['raw'][0]['load_read_mib'])} | "
            f"{'yes' if r['same_tokens'] else 'NO'} |"
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
    p.add_argument("--memory-budget-one", help="the 1-rank runs' budget [--memory-budget]")
    p.add_argument("--layers", help="layers per rank for every multi-rank run, e.g. 6,14,14,6")
    p.add_argument("--net", action="append",
                   help="loopback (default), or a tbf rate (1gbit, 10gbit; none = unshaped) "
                        "for ranks in their own network namespaces")  # fmt: skip
    p.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    p.add_argument(
        "--lock",
        help="a file to flock around each configuration's run (benchmarks "
        "sharing a machine take turns; one run, not the whole bench)",
    )
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--one-tiers", help=argparse.SUPPRESS)
    p.add_argument("--one-hosts", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        extra: dict[str, Any] = dict(first_layer=args.first_layer)
        if args.memory_budget:
            extra["memory_budget"] = args.memory_budget
        if args.layers:
            extra["layers"] = args.layers
        res = asyncio.run(one(args.model, args.one, args.one_tiers, args.mode, args.k,
                              args.tokens, extra, args.one_hosts))  # fmt: skip
        print(json.dumps(res))
        return
    tiers_list = args.tiers or ["pread"]
    ranks_list = [int(r) for r in args.ranks.split(",")]
    nets = args.net or ["loopback"]
    configs = [(t, n if r > 1 else "-", r) for t in tiers_list for n in nets for r in ranks_list]
    configs = list(dict.fromkeys(configs))  # 1 rank once per tiers
    ns = None
    if any(n != "loopback" for n in nets):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from netns_ranks import Namespaces

        ns = Namespaces(max(ranks_list))
        ns.up("none")
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    try:
        for rnd in range(args.rounds):
            for tiers, net, ranks in configs:
                res = run_one(args, ranks, tiers, net, ns if net != "loopback" else None)
                runs.setdefault((tiers, net, ranks), []).append(res)
                print(f"round {rnd} {tiers} {net} ranks={ranks}: {res['decode_tps']:.3f} tok/s "
                      f"rss {res['peak_rss_mib']} {os.getloadavg()[0]:.1f}", file=sys.stderr,
                      flush=True)  # fmt: skip
    finally:
        if ns is not None:
            ns.down()
    rows = [summary(runs, key, ranks_list) for key in runs]
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
