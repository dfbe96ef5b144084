"""Pipeline parallel on one machine: tok/s, per-rank peak RSS and ring cost at 1, 2, 4 ranks.

    .venv/bin/python tools/bench/dist_bench.py MODEL [--ranks 1,2,4] [--tiers pread]
        [--tiers "throttle:bw=400MB/s,lat=200us>pread"] [--mode route] [--k 4]
        [--tokens 16] [--rounds 2] [--first-layer resident] [--memory-budget 2GiB (per rank)]
        [--memory-budget-one 3GiB (1 rank)]
        [--layers 6,14,14,6] [--net loopback] [--net 1gbit] [--net 10gbit]
    [--json out.json] [--md out.md]

Each (tiers, net, ranks) configuration runs in a fresh process (one ring per process),
configurations interleaved round by round, their order rotated by one each round (no
configuration always runs first); per configuration: one warm-up request,
one measured request (decode tok/s, rank 0's blocked-load ms/step, its tokens), every
rank's peak RSS, the bytes each token puts on the ring, the time of an empty trip
around it (ping), and the ring's ms per token: a decode token's time minus every rank's
own decode step (messages, hand-offs, waking up). Medians over rounds; ratios against 1
rank, and against the loopback run of the same ranks, within each round; whether every
run's tokens equal the first run's of the first rank count. A configuration that fails or
runs past `--timeout` (its whole process group killed) is recorded as such and the bench
goes on; the JSON is rewritten after every configuration, so a cut run keeps its rounds.

`--net loopback` (the default) runs the ranks as local processes on 127.0.0.1; a tbf
rate (`1gbit`, `10gbit`, or `none` for unshaped links) runs each rank in its own network
namespace behind a bridge, links shaped to that rate (tools/netns_ranks.py; needs root),
the ring over the namespaces' addresses only. 1 rank runs once per round whatever the nets.
The namespaces are torn down however the bench ends (an error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_lock import held

PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]


async def one(
    path: str,
    ranks: int,
    tiers: str,
    mode: str,
    k: int,
    tokens: int,
    extra: dict[str, Any],
    hosts: str | None = None,
) -> dict[str, Any]:
    from edge0.ranks.launch import node_of
    from edge0.ranks.pipeline import gather_stats, ping
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
        out: dict[str, Any] = dict(
            ranks=ranks,
            tiers=tiers,
            open_s=opened,
            decode_tps=st.decode_tps,
            blocked_ms=st.blocked_ms_per_step,
            bytes_per_token=st.bytes_per_token,
            tokens=got,
        )
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
            out["read_layers"] = [
                [int(s["read_layer_min"]), int(s["read_layer_max"])] for s in stats
            ]
            out["split"] = [[r.start, r.stop - 1] for r in node.split.ranges]
            plan = eng.setup.memory_plan
            out["plan0"] = None if plan is None else plan.line()
            out["ring_bytes_per_token"] = ranks * node.link.codec.nbytes  # n hops per token
            out["ring_trip_ms"] = statistics.median(trips) * 1e3
            out["rank_decode_ms"] = [
                s["decode_wall_s"] / max(1.0, s["decode_steps"]) * 1e3 for s in stats
            ]
        else:
            out["peak_rss_mib"] = [peak_rss_bytes() / 2**20]
            recs = eng.setup.ctx.records[-(len(PROMPT) + tokens - 1) :]
            out["rank_cpu_ms"] = [sum(r.cpu for r in recs) / len(recs) * 1e3]
            out["rank_wall_ms"] = [sum(r.wall for r in recs) / len(recs) * 1e3]
            out["ring_bytes_per_token"] = 0
            out["ring_trip_ms"] = 0.0
            decode = [r.wall for r in recs if not r.prefill]
            out["rank_decode_ms"] = [sum(decode) / max(1, len(decode)) * 1e3]
            out["load_read_mib"] = [-1.0]  # not measured for one process
            plan = eng.setup.memory_plan
            out["plan0"] = None if plan is None else plan.line()
        # a decode token's time outside every rank's own decode step: the ring's share
        out["ring_ms_per_token"] = 1e3 / st.decode_tps - sum(out["rank_decode_ms"])
    return out


def run_one(
    args: argparse.Namespace, ranks: int, tiers: str, net: str, ns: Any = None
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        args.model,
        "--one",
        str(ranks),
        "--one-tiers",
        tiers,
        "--mode",
        args.mode,
        "--k",
        str(args.k),
        "--tokens",
        str(args.tokens),
        "--first-layer",
        args.first_layer,
    ]
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
        load0 = os.getloadavg()
        rc, out, err = bounded(cmd, args.timeout, env)
        if rc != 0 and "terminate called" in err:  # MLX thread-exit abort
            print("retrying after an MLX abort at exit", file=sys.stderr)
            rc, out, err = bounded(cmd, args.timeout, env)
    net = net if ranks > 1 else "-"
    if rc != 0:
        why = f"ran past {args.timeout:g} s" if rc == 124 else f"exit {rc}: {err[-2000:]}"
        print(f"{' '.join(cmd)} failed: {why}", file=sys.stderr)
        return dict(
            ranks=ranks,
            tiers=tiers,
            net=net,
            failed=why,
            load_before=load0,
            load_after=os.getloadavg(),
        )
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    got["net"] = net
    got["load"] = os.getloadavg()[0]
    got["load_before"], got["load_after"] = load0, os.getloadavg()
    if ns is not None and ranks > 1:
        got["link"] = dict(rate=ns.rate, burst=ns.burst)
    return got


def bounded(cmd: list[str], timeout: float, env: dict[str, str] | None) -> tuple[int, str, str]:
    """Run `cmd` in its own process group (the ranks it spawns included); past `timeout`
    seconds the whole group is killed and the exit status is 124."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return 124, out, err
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


Runs = dict[tuple[str, str, int], list[dict[str, Any]]]


def per_round(
    got: list[dict[str, Any]], base: list[dict[str, Any]], key: str, op: Any
) -> list[float]:
    """`op(run[key], base[key])` for each round in which both ran (a failed run is skipped)."""
    return [
        op(g[key], b[key])
        for g, b in zip(got, base, strict=False)
        if "failed" not in g and "failed" not in b
    ]


def med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summary(runs: Runs, key: tuple[str, str, int], ranks_list: list[int]) -> dict[str, Any]:
    """One configuration's medians over the rounds it finished; per-round ratios against the
    base rank count's run and against the loopback run of the same ranks."""
    tiers, net, ranks = key
    got = runs[key]
    ok = [g for g in got if "failed" not in g]
    base = runs.get((tiers, "-" if ranks_list[0] == 1 else net, ranks_list[0]), got)
    loop = runs.get((tiers, "loopback", ranks)) if ranks > 1 else None
    firsts = [b for b in base if "failed" not in b]
    want = firsts[0]["tokens"] if firsts else None
    row: dict[str, Any] = dict(
        tiers=tiers,
        net=net,
        ranks=ranks,
        rounds=len(ok),
        failed=[g["failed"] for g in got if "failed" in g],
    )
    if not ok:
        return dict(row, raw=got)

    def each(name: str) -> list[float]:
        return [statistics.median(g[name][i] for g in ok) for i in range(len(ok[0][name]))]

    row.update(
        decode_tps=statistics.median(g["decode_tps"] for g in ok),
        decode_tps_rounds=[g.get("decode_tps") for g in got],
        ratio=med(per_round(got, base, "decode_tps", lambda x, y: x / y)),
        vs_loopback=None
        if loop is None
        else med(per_round(got, loop, "decode_tps", lambda x, y: x / y)),
        ring_ms_per_token=med([g["ring_ms_per_token"] for g in ok if "ring_ms_per_token" in g]),
        ring_ms_rounds=[g.get("ring_ms_per_token") for g in got],
        ring_ms_vs_loopback=None
        if loop is None
        else med(per_round(got, loop, "ring_ms_per_token", lambda x, y: x - y)),
        peak_rss_mib=each("peak_rss_mib"),
        rank_cpu_ms=each("rank_cpu_ms"),
        rank_decode_ms=each("rank_decode_ms") if all("rank_decode_ms" in g for g in ok) else [],
        blocked_ms=statistics.median(g["blocked_ms"] for g in ok),
        ring_bytes_per_token=ok[0]["ring_bytes_per_token"],
        ring_trip_ms=statistics.median(g["ring_trip_ms"] for g in ok),
        ring_trip_rounds=[g.get("ring_trip_ms") for g in got],
        # token time minus every rank's own step time (prompt steps included; the older figure)
        outside_ms=statistics.median(
            1e3 / g["decode_tps"] - sum(g.get("rank_wall_ms", [0])) for g in ok
        ),
        same_tokens=all(g["tokens"] == want for g in ok),
        load=[[round(x, 1) for x in g.get("load_before", [g.get("load", 0)])[:3]] for g in got],
        raw=got,
    )
    return row


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def rounds(xs: list[float | None], spec: str) -> str:
    return " / ".join("failed" if x is None else format(x, spec) for x in xs)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| tiers | net | ranks | decode tok/s (median) | per round | vs 1 rank | "
        "vs loopback (per-round median) | ring ms/token (median) | per round | "
        "ring ms/token minus loopback's | empty ring trip ms | "
        "decode step ms per rank | peak RSS per rank, MiB | "
        "compute-thread CPU ms/step per rank | blocked ms/step (rank 0) | "
        "ring bytes/token | read while loading per rank, MiB | tokens = first run's | "
        "load (1/5/15 min) before each round |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "decode_tps" not in r:
            lines.append(
                f"| `{r['tiers']}` | {r['net']} | {r['ranks']} | failed: "
                f"{'; '.join(r['failed'])[:200]} |" + " |" * 15
            )
            continue
        ok = [g for g in r["raw"] if "failed" not in g]
        lines.append(
            f"| `{r['tiers']}` | {r['net']} | {r['ranks']} | {r['decode_tps']:.3f} | "
            f"{rounds(r['decode_tps_rounds'], '.3f')} | {fmt(r['ratio'], '.2f')} | "
            f"{fmt(r['vs_loopback'], '.2f')} | {fmt(r['ring_ms_per_token'], '.1f')} | "
            f"{rounds(r['ring_ms_rounds'], '.1f')} | {fmt(r['ring_ms_vs_loopback'], '+.1f')} | "
            f"{r['ring_trip_ms']:.2f} | "
            f"{' / '.join(f'{m:.0f}' for m in r['rank_decode_ms'])} | "
            f"{' / '.join(f'{m:.0f}' for m in r['peak_rss_mib'])} | "
            f"{' / '.join(f'{m:.1f}' for m in r['rank_cpu_ms'])} | {r['blocked_ms']:.2f} | "
            f"{r['ring_bytes_per_token']} | "
            f"{' / '.join(f'{m:.0f}' for m in ok[0]['load_read_mib'])} | "
            f"{'yes' if r['same_tokens'] else 'NO'} | "
            f"{'; '.join('/'.join(f'{x:.1f}' for x in ld) for ld in r['load'])} |"
        )
    return "\n".join(lines)


def write(args: argparse.Namespace, runs: Runs, ranks_list: list[int], done: bool) -> str:
    """The summary table; the JSON (and markdown) rewritten with what has run so far."""
    rows = [summary(runs, key, ranks_list) for key in runs]
    md = table(rows)
    load = os.getloadavg()
    if args.json:
        Path(args.json).write_text(
            json.dumps(dict(command=sys.argv, load=load, finished=done, rows=rows), indent=1) + "\n"
        )
    if args.md:
        Path(args.md).write_text(
            f"# Pipeline parallel on one machine\n\n`{' '.join(sys.argv)}`\n\n"
            f"Load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n\n{md}\n"
        )
    return md


def terminate(signum: int, frame: Any) -> None:
    """SIGTERM ends the bench like Ctrl-C: through the `finally` that tears namespaces down."""
    raise KeyboardInterrupt(f"signal {signum}")


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
    p.add_argument(
        "--net",
        action="append",
        help="loopback (default), or a tbf rate (1gbit, 10gbit; none = unshaped) "
        "for ranks in their own network namespaces",
    )
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
        res = asyncio.run(
            one(
                args.model,
                args.one,
                args.one_tiers,
                args.mode,
                args.k,
                args.tokens,
                extra,
                args.one_hosts,
            )
        )
        print(json.dumps(res))
        return
    tiers_list = args.tiers or ["pread"]
    ranks_list = [int(r) for r in args.ranks.split(",")]
    nets = args.net or ["loopback"]
    configs = [(t, n if r > 1 else "-", r) for t in tiers_list for n in nets for r in ranks_list]
    configs = list(dict.fromkeys(configs))  # 1 rank once per tiers
    ns = None
    signal.signal(signal.SIGTERM, terminate)
    runs: Runs = {}
    try:
        if any(n != "loopback" for n in nets):
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from netns_ranks import Namespaces

            ns = Namespaces(max(ranks_list))
            ns.up("none")
        for rnd in range(args.rounds):
            shift = rnd % len(configs)  # rotate: each configuration takes each place in turn
            for tiers, net, ranks in configs[shift:] + configs[:shift]:
                res = run_one(args, ranks, tiers, net, ns if net != "loopback" else None)
                runs.setdefault((tiers, net, ranks), []).append(res)
                what = res.get("failed") or (
                    f"{res['decode_tps']:.3f} tok/s, ring {res['ring_ms_per_token']:.1f} ms/token"
                )
                print(
                    f"round {rnd} {tiers} {net} ranks={ranks}: {what}; load "
                    f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}",
                    file=sys.stderr,
                    flush=True,
                )
                write(args, runs, ranks_list, done=False)
    except KeyboardInterrupt as exc:
        print(
            f"stopped ({exc or 'interrupted'}); {args.json or 'the table'} holds the "
            "configurations that ran",
            file=sys.stderr,
        )
        sys.exit(130)
    finally:
        if ns is not None:
            ns.down()
    print(write(args, runs, ranks_list, done=True))


if __name__ == "__main__":
    main()
