"""Soak: one engine, many prompts; RSS, MLX memory and the native heap after each prompt.

Opens one Engine, runs `--prompts` prompts of `--prompt-len` tokens (the bench's
prompt texts, in turn) with `--max-tokens` generated each, and prints one line per
prompt: RSS (VmRSS), peak RSS (VmHWM), MLX active and cached memory, glibc's heap
in use and free (mallinfo2: arena + mmapped in use, free chunks kept), and the
count of Python objects. A leak shows as a trend in RSS across prompts; glibc's
free-but-kept heap tells fragmentation from a leak. The last line is the fit of
RSS against the prompt index over the second half and over all prompts (MiB per
prompt). `--json` is rewritten after every prompt, so a soak stopped early keeps its rows.

Usage: .venv/bin/python tools/bench/soak.py MODEL --prompts 50 --prompt-len 256
       [--memory-budget 1536MiB] [--tiers 'ram:1GiB>direct'] [--prefill-chunk 64]
       [--first-layer wrap] [--k 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import time
from typing import Any

import mlx.core as mx

from edge0.bench.worker import encode_prompts
from edge0.runtime.engine.api import Engine
from edge0.stats import current_rss_bytes, peak_rss_bytes

_MIB = 1 << 20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap() -> tuple[float, float]:
    """(in use, free but kept) MiB of glibc's heap; (0, 0) where mallinfo2 is missing."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return 0.0, 0.0
    m = libc.mallinfo2()
    return (m.uordblks + m.hblkhd) / _MIB, m.fordblks / _MIB


def slope(ys: list[float]) -> float:
    """Least-squares slope of ys against their index (0 for fewer than 2)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx_ = (n - 1) / 2
    my = sum(ys) / n
    num = sum((i - mx_) * (y - my) for i, y in enumerate(ys))
    return num / sum((i - mx_) ** 2 for i in range(n))


def write_rows(a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    with open(a.json, "w") as f:
        json.dump({"args": vars(a), "rows": rows}, f, indent=1)


async def soak(a: argparse.Namespace) -> list[dict[str, Any]]:
    opts: dict[str, Any] = dict(
        mode=a.mode,
        top_k=a.k,
        tiers=a.tiers,
        first_layer=a.first_layer,
        memory_budget=a.memory_budget,
        prefill_chunk=a.prefill_chunk,
    )
    rows: list[dict[str, Any]] = []
    async with Engine.open(a.model, **{k: v for k, v in opts.items() if v is not None}) as eng:
        if eng.setup.memory_plan is not None:
            print(eng.setup.memory_plan.line(), flush=True)
        prompts = encode_prompts(eng.tokenizer, a.prompts, a.prompt_len)
        for i, ids in enumerate(prompts):
            t0 = time.perf_counter()
            async for _ in eng.tokens(ids, max_tokens=a.max_tokens, stop=False):
                pass
            wall = time.perf_counter() - t0
            mlx = await eng._compute.run(lambda: (mx.get_active_memory(), mx.get_cache_memory()))
            used, free = heap()
            row = {
                "prompt": i + 1,
                "wall_s": round(wall, 2),
                "rss": current_rss_bytes() / _MIB,
                "hwm": peak_rss_bytes() / _MIB,
                "mlx_active": mlx[0] / _MIB,
                "mlx_cache": mlx[1] / _MIB,
                "heap_used": used,
                "heap_free": free,
                "objects": len(gc.get_objects()),
            }
            rows.append(row)
            if a.json:  # after every prompt: a soak stopped early keeps its rows
                write_rows(a, rows)
            print(
                " ".join(
                    f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                ),
                flush=True,
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--mode", default="route")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tiers", default="ram:1GiB>direct")
    ap.add_argument("--first-layer", default="wrap")
    ap.add_argument("--memory-budget", default=None)
    ap.add_argument("--prefill-chunk", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args()
    rows = asyncio.run(soak(a))
    half = [r["rss"] for r in rows[len(rows) // 2 :]]
    first, last = rows[0]["rss"], rows[-1]["rss"]
    print(
        f"RSS after prompt 1 {first:.1f} MiB, after prompt {len(rows)} {last:.1f} MiB, "
        f"max {max(r['rss'] for r in rows):.1f}; second-half slope {slope(half):+.2f} MiB/prompt, "
        f"all prompts {slope([r['rss'] for r in rows]):+.2f}"
    )


if __name__ == "__main__":
    main()
