"""Prefill CPU cost, chunked vs one-token: process CPU time (all threads) per prompt token.

Wall time on a loaded shared machine says little; the CPU time the whole
process spends on a prompt (compute thread, tier workers, event loop) does not
depend on how many other processes share the cores. Each variant opens its own
Engine (route, K=4 by default), runs a 4-token warm-up request, then one prompt
of `--prompt-len` tokens with `max_tokens=1`; variants are interleaved per round.
`--overlap none,router,heads` also compares reading the next layer's predicted first
group during this layer's compute (edge0.runtime.prefill.chunks.OVERLAP), predicted by
its router or by the prerouter heads (edge0.runtime.prefill.ahead), for each chunk.

Usage: .venv/bin/python docs/benchmarks/scripts/prefill_cpu.py MODEL --prompt-len 96
       --chunks 1,96,32
       [--overlap none,router,heads] [--predictor heads] [--json out.json]
       [--tiers 'throttle:bw=80MB/s,lat=100us>pread']
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from edge0.bench.worker import encode_prompts
from edge0.runtime.engine.api import Engine
from edge0.runtime.prefill import chunks as prefill
from edge0.runtime.prefill.ahead import OVERLAPS


async def one(
    model: str, n: int, chunk: int, tiers: str, k: int, overlap: str, predictor: str | None
) -> dict[str, float]:
    prefill.OVERLAP = overlap
    async with Engine.open(
        model, mode="route", top_k=k, tiers=tiers, prefill_chunk=chunk, predictor=predictor
    ) as eng:
        ids = encode_prompts(eng.tokenizer, 1, n)[0]
        async for _ in eng.tokens(ids[:4], max_tokens=1, stop=False):
            pass
        sched = eng.setup.scheduler
        miss0 = sched.stats.staged_misses if sched is not None else 0
        c0 = time.process_time()
        async for _ in eng.tokens(ids, max_tokens=1, stop=False):
            pass
        cpu = time.process_time() - c0
        misses = (sched.stats.staged_misses - miss0) if sched is not None else 0
        s = eng.last_stats
        assert s is not None
        return {
            "cpu": cpu / n * 1e3,
            "wall": s.prefill_s / n * 1e3,
            "blocked": s.prefill_blocked_ms / n,
            "mib": s.prefill_bytes_per_token / 2**20,
            "tps": n / s.prefill_s,
            "misses": misses,  # experts compute found neither staged nor in flight
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--chunks", default="1,96,32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tiers", default="pread")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--overlap", default=prefill.OVERLAP, help=f"comma-separated: {OVERLAPS}")
    ap.add_argument("--predictor", default=None, help="route mode's predictor (default: Engine's)")
    ap.add_argument("--json", default=None, help="also write every run's figures here")
    a = ap.parse_args()
    overlaps = a.overlap.split(",")
    bad = [ov for ov in overlaps if ov not in OVERLAPS]
    if bad:
        ap.error(f"--overlap {','.join(bad)}: choose from {','.join(OVERLAPS)}")
    runs: list[dict[str, object]] = []
    for r in range(a.rounds):
        for c in (int(x) for x in a.chunks.split(",")):
            for ov in overlaps:
                got = asyncio.run(one(a.model, a.prompt_len, c, a.tiers, a.k, ov, a.predictor))
                load = os.getloadavg()
                runs.append({"round": r + 1, "chunk": c, "overlap": ov, **got, "load": load[:2]})
                if a.json:  # after every run: a killed benchmark keeps what it measured
                    with open(a.json, "w") as f:
                        json.dump({"args": vars(a), "runs": runs}, f, indent=1)
                print(
                    f"round {r + 1} chunk {c} overlap {ov}: {got['tps']:.2f} prompt tok/s, "
                    f"CPU {got['cpu']:.0f} ms/tok, wall {got['wall']:.0f} ms/tok, blocked "
                    f"{got['blocked']:.1f} ms/tok, {got['mib']:.2f} MiB/tok, "
                    f"{got['misses']} demand reads, "
                    f"load {load[0]:.1f} / {load[1]:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
