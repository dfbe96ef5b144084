"""A request joining a running batch: its time to first token and the running requests' tokens.

    .venv/bin/python docs/benchmarks/scripts/join_bench.py MODEL
        [--join-chunk whole --join-chunk 256]
        [--running 1] [--prompt-len 1024] [--mode route] [--k 4] [--tiers pread]
        [--rounds 2] [--prefill-chunk N] [--lock FILE] [--json out.json]

Per variant (`--join-chunk`: `whole` = the joiner's whole prompt before the next decode
step; N = pieces of N prompt tokens with one decode step of the running requests between
two pieces), one engine (max_batch = running + 1): after a warm-up request, `--running`
requests with 8-token prompts decode; once each has 4 tokens, a request with a
`--prompt-len` prompt joins. Measured: the joiner's time to first token (from its
submission), the running requests' tokens and their largest gap between two tokens
inside that window, and their tok/s before it (steady decode). Variants interleave round
by round; medians. Every request's tokens are compared with the same request run alone
(once, on a fresh engine with max_batch 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools" / "bench"))
from bench_lock import held  # noqa: E402

SHORT = 8  # prompt tokens of the running requests
BEFORE = 4  # tokens each running request has when the joiner comes


def prompts(vocab: int, running: int, prompt_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = [[rng.randrange(3, vocab) for _ in range(SHORT)] for _ in range(running)]
    return [*out, [rng.randrange(3, vocab) for _ in range(prompt_len)]]


async def variant(args: argparse.Namespace, join_chunk: int | None) -> dict[str, Any]:
    from edge0.runtime.engine.api import Engine

    opts = engine_opts(args)
    async with Engine.open(
        args.model, max_batch=args.running + 1, join_chunk=join_chunk, **opts
    ) as eng:
        vocab = int(getattr(eng.tokenizer, "vocab_size", 0) or 1000)
        ps = prompts(vocab, args.running, args.prompt_len, args.seed)
        [t async for t in eng.tokens(ps[0][:4], max_tokens=2, stop=False)]  # warm-up
        times: list[list[float]] = [[] for _ in ps]
        toks: list[list[int]] = [[] for _ in ps]
        ready = asyncio.Event()
        joined_at: list[float] = []

        async def run(i: int, n: int) -> None:
            if i == args.running:
                await ready.wait()
                joined_at.append(time.perf_counter())
            async for t in eng.tokens(ps[i], max_tokens=n, stop=False):
                toks[i].append(t)
                times[i].append(time.perf_counter())
                if all(len(toks[j]) >= BEFORE for j in range(args.running)):
                    ready.set()

        n_run = BEFORE + args.after
        await asyncio.gather(
            *(run(i, n_run) for i in range(args.running)), run(args.running, args.joiner_tokens)
        )
    t_join, t_first = joined_at[0], times[args.running][0]
    inside = [[t for t in ts if t_join <= t <= t_first] for ts in times[: args.running]]
    gaps = [max(b - a for a, b in zip([t_join, *ts], [*ts, t_first], strict=True)) for ts in inside]
    steady = [(BEFORE - 1) / (ts[BEFORE - 1] - ts[0]) for ts in times[: args.running]]
    return dict(
        join_chunk=join_chunk,
        ttft_s=t_first - t_join,
        prompt_tps=args.prompt_len / (t_first - t_join),
        running_tokens_in_window=[len(ts) for ts in inside],
        running_tps_in_window=statistics.fmean(len(ts) for ts in inside) / (t_first - t_join),
        running_max_gap_s=max(gaps),
        running_steady_tps=statistics.fmean(steady),
        tokens=toks,
        load=os.getloadavg()[0],
    )


async def alone(args: argparse.Namespace) -> list[list[int]]:
    """Every request of the variants, run alone (the reference tokens)."""
    from edge0.runtime.engine.api import Engine

    async with Engine.open(args.model, **engine_opts(args)) as eng:
        vocab = int(getattr(eng.tokenizer, "vocab_size", 0) or 1000)
        ps = prompts(vocab, args.running, args.prompt_len, args.seed)
        ns = [BEFORE + args.after] * args.running + [args.joiner_tokens]
        return [
            [t async for t in eng.tokens(p, max_tokens=n, stop=False)]
            for p, n in zip(ps, ns, strict=True)
        ]


def engine_opts(args: argparse.Namespace) -> dict[str, Any]:
    predictor = "init" if args.mode in ("hint", "route") else None
    return dict(
        tiers=args.tiers,
        mode=args.mode,
        top_k=args.k,
        predictor=predictor,
        prefill_chunk=args.prefill_chunk,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--join-chunk", action="append", help="whole, or prompt tokens per piece")
    p.add_argument("--running", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--after", type=int, default=24, help="running tokens after the join")
    p.add_argument("--joiner-tokens", type=int, default=4)
    p.add_argument("--mode", default="route")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tiers", default="pread")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefill-chunk", type=int, help="prompt tokens per forward [engine's]")
    p.add_argument("--json")
    p.add_argument("--lock", help="a file to flock around each variant's run")
    args = p.parse_args()
    chunks = [None if c == "whole" else int(c) for c in args.join_chunk or ["whole", "256"]]
    ref = asyncio.run(alone(args))
    runs: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(args.rounds):
        for c in chunks:
            with held(args.lock):
                got = asyncio.run(variant(args, c))
            got["same_tokens_as_alone"] = got["tokens"] == ref
            runs.setdefault(str(c or "whole"), []).append(got)
            print(
                f"round {rnd} join_chunk {c or 'whole'}: ttft {got['ttft_s']:.2f} s, running "
                f"max gap {got['running_max_gap_s']:.2f} s, window tok/s "
                f"{got['running_tps_in_window']:.3f}, same {got['same_tokens_as_alone']}, "
                f"load {got['load']:.1f}",
                file=sys.stderr,
                flush=True,
            )
    rows = [summary(name, got) for name, got in runs.items()]
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(command=sys.argv, rows=rows), indent=1) + "\n")


def summary(name: str, got: list[dict[str, Any]]) -> dict[str, Any]:
    med = {
        k: statistics.median(g[k] for g in got)
        for k in (
            "ttft_s",
            "prompt_tps",
            "running_tps_in_window",
            "running_max_gap_s",
            "running_steady_tps",
            "load",
        )
    }
    return dict(
        join_chunk=name,
        rounds=len(got),
        **med,
        same_tokens=all(g["same_tokens_as_alone"] for g in got),
        raw=got,
    )


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| join chunk | joiner TTFT s | joiner prompt tok/s | running tok/s in the window | "
        "running max gap s | running tok/s before | tokens = alone | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['join_chunk']} | {r['ttft_s']:.2f} | {r['prompt_tps']:.1f} | "
            f"{r['running_tps_in_window']:.3f} | {r['running_max_gap_s']:.2f} | "
            f"{r['running_steady_tps']:.3f} | {'yes' if r['same_tokens'] else 'NO'} | "
            f"{r['load']:.1f} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    main()
