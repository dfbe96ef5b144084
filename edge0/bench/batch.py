"""`edge0 bench batch`: decode speed and reads per token with 1, 2, 4, 8 requests decoded together
(docs/benchmarks/batch.md).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge0.log import get_logger

log = get_logger("edge0.bench.batch")
_MIB = 1 << 20


async def measure(
    path: Path,
    tiers: str,
    mode: str,
    batch: int,
    k: int | None,
    tokens: int,
    prompt_len: int,
    seed: int,
    same: bool = False,
) -> dict[str, Any]:
    """One engine, `batch` concurrent requests; the figures of its full-batch decode steps.
    `same`: every request gets the same prompt (so the same greedy tokens and experts: the
    most a batch can share); else each its own random prompt."""
    from edge0.runtime.engine.api import Engine

    rng = random.Random(seed)
    predictor = "init" if mode in ("hint", "route") else None
    async with Engine.open(
        path, tiers=tiers, mode=mode, top_k=k, max_batch=batch, predictor=predictor
    ) as eng:
        assert eng.batcher is not None or batch == 1
        vocab = int(getattr(eng.tokenizer, "vocab_size", 0) or 1000)
        warm = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        [t async for t in eng.tokens(warm, max_tokens=2, stop=False)]  # first-touch costs
        prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(batch)]
        if same:
            prompts = [prompts[0]] * batch

        async def one(p: list[int]) -> int:
            return len([t async for t in eng.tokens(p, max_tokens=tokens, stop=False)])

        log_from = len(eng.batcher.log) if eng.batcher is not None else 0
        records_from = len(eng.setup.ctx.records)
        t0, cpu0 = time.perf_counter(), time.process_time()
        got = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - t0
        if eng.batcher is not None:
            steps = [s for s in eng.batcher.log[log_from:] if s.rows == batch]
            rows = [(s.rows, s.wall, s.wait, s.bytes, s.eval, s.cpu) for s in steps]
        else:  # max_batch 1: the FIFO path, its own step records
            recs = [r for r in eng.setup.ctx.records[records_from:] if not r.prefill]
            stats = eng.last_stats
            assert stats is not None
            per, cpu = stats.decode_bytes_per_step, (time.process_time() - cpu0) / len(recs)
            rows = [(1, r.wall, r.wait, int(per), r.eval, cpu) for r in recs]
    n = sum(r[0] for r in rows)
    dec = sum(r[1] for r in rows)
    return {
        "tiers": tiers,
        "mode": mode,
        "batch": batch,
        "k": k,
        "tokens": sum(got),
        "same": same,
        "steps": len(rows),
        "agg_tps": n / dec if dec else 0.0,
        "per_request_tps": len(rows) / dec if dec else 0.0,
        "mib_per_token": sum(r[3] for r in rows) / n / _MIB if n else 0.0,
        "blocked_ms_per_step": statistics.fmean(r[2] for r in rows) * 1e3 if rows else 0.0,
        "compute_ms_per_step": statistics.fmean(r[4] for r in rows) * 1e3 if rows else 0.0,
        "cpu_ms_per_step": statistics.fmean(r[5] for r in rows) * 1e3 if rows else 0.0,
        "wall_s": wall,
    }


def calibrated_throttle(page: dict[str, Any], io_ratio: float, lat: str = "100us") -> str:
    """A throttle over pread where a step's reads take `io_ratio` x its compute (`page`:
    a reactive batch-1 run over the page cache)."""
    bw = page["mib_per_token"] * _MIB / (page["compute_ms_per_step"] / 1e3 * io_ratio)
    return f"throttle:bw={bw / 1e6:.1f}MB/s,lat={lat}>pread"


def run_bench(
    path: Path,
    modes: list[str],
    batches: list[int],
    tiers: list[str],
    io_ratio: float | None,
    k: int | None,
    tokens: int,
    prompt_len: int,
    repeats: int,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    same: bool = False,
) -> dict[str, Any]:
    """Every (tier, mode, batch) variant, `repeats` interleaved rounds; medians per variant
    (`on_run` sees each run's figures as it ends)."""
    from edge0.loop import run

    stacks = list(tiers)
    calibration: dict[str, Any] | None = None
    if io_ratio is not None:
        calibration = run(measure(path, "pread", "reactive", 1, k, tokens, prompt_len, 0))
        stacks.append(calibrated_throttle(calibration, io_ratio))
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for rnd in range(repeats):
        for tier in stacks:
            for mode in modes:
                for b in batches:
                    res = run(measure(path, tier, mode, b, k, tokens, prompt_len, rnd + 1, same))
                    log.info("bench_batch_run", round=rnd, **res)
                    if on_run is not None:
                        on_run(res)
                    runs.setdefault((tier, mode, b), []).append(res)
    table = []
    for (tier, mode, b), rs in runs.items():
        row = {
            key: statistics.median(r[key] for r in rs)
            for key in (
                "agg_tps",
                "per_request_tps",
                "mib_per_token",
                "blocked_ms_per_step",
                "compute_ms_per_step",
                "cpu_ms_per_step",
            )
        }
        base = runs.get((tier, mode, 1))
        if base:  # per-round ratio to batch 1 of the same round
            row["x_batch1"] = statistics.median(
                r["agg_tps"] / q["agg_tps"] for r, q in zip(rs, base, strict=True) if q["agg_tps"]
            )
        table.append({"tiers": tier, "mode": mode, "batch": b, "rounds": len(rs), **row})
    return {
        "model": str(path),
        "k": k,
        "tokens": tokens,
        "prompt_len": prompt_len,
        "repeats": repeats,
        "same_prompt": same,
        "calibration": calibration,
        "rows": table,
        "load_avg": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| tiers | mode | B | agg tok/s | x B=1 | per-request tok/s | MiB read/token | "
        "blocked ms/step | compute ms/step | process CPU ms/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['tiers']} | {r['mode']} | {r['batch']} | {r['agg_tps']:.2f} | "
            f"{r.get('x_batch1', 0.0):.2f} | {r['per_request_tps']:.2f} | "
            f"{r['mib_per_token']:.2f} | {r['blocked_ms_per_step']:.1f} | "
            f"{r['compute_ms_per_step']:.1f} | {r['cpu_ms_per_step']:.0f} |"
        )
    return "\n".join(lines) + "\n"
