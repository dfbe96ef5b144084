"""Where a prompt chunk's memory goes: peak MLX memory and peak RSS of one prompt, per variant.

Each variant (prefill chunk C, recurrent sub-chunk S; S=0 leaves mlx-lm's Gated
DeltaNet unbounded) opens its own Engine in this process, runs a 4-token warm-up,
clears MLX's buffer cache, resets VmHWM, then one prompt of `--prompt-len`
tokens with `max_tokens=2`. Printed: the peak MLX memory over what was in use
before the prompt (per chunk token), the generation's peak RSS (VmHWM), MLX's
active and cached memory at the end, and MiB read per prompt token.

Usage: .venv/bin/python docs/benchmarks/scripts/prefill_memory.py MODEL --variants 64:0,64:16,256:16
       [--memory-budget 3GiB] [--tiers 'ram>direct'] [--first-layer wrap]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
from typing import Any

import mlx.core as mx

from edge0.bench.worker import encode_prompts, reset_peak_rss
from edge0.runtime.engine.api import Engine
from edge0.runtime.prefill import memory as prefill_memory
from edge0.stats import current_rss_bytes, peak_rss_bytes

_MIB = 1 << 20


async def one(a: argparse.Namespace, chunk: int, sub: int) -> dict[str, Any]:
    prefill_memory.SUB_TOKENS = sub
    opts: dict[str, Any] = dict(
        mode="route",
        top_k=a.k,
        tiers=a.tiers,
        prefill_chunk=chunk,
        first_layer=a.first_layer,
        memory_budget=a.memory_budget,
    )
    async with Engine.open(a.model, **opts) as eng:
        ids = encode_prompts(eng.tokenizer, 1, a.prompt_len)[0]
        async for _ in eng.tokens(ids[:4], max_tokens=1, stop=False):
            pass

        def settle() -> int:
            gc.collect()
            mx.clear_cache()
            return int(mx.get_active_memory())

        active = await eng._compute.run(settle)
        rss0 = current_rss_bytes()
        reset_peak_rss()
        async for _ in eng.tokens(ids, max_tokens=2, stop=False):
            pass
        s = eng.last_stats
        assert s is not None
        cached = await eng._compute.run(lambda: (mx.get_active_memory(), mx.get_cache_memory()))
        return {
            "chunk": eng.setup.ctx.prefill_chunk,
            "mlx_over": (s.peak_mlx_bytes - active) / _MIB,
            "rss_start": rss0 / _MIB,
            "hwm": peak_rss_bytes() / _MIB,
            "active_end": cached[0] / _MIB,
            "cache_end": cached[1] / _MIB,
            "mib_tok": s.prefill_bytes_per_token / _MIB,
            "tps": s.prompt_tokens / s.prefill_s if s.prefill_s else 0.0,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--variants", default="64:0,64:16")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--tiers", default="pread")
    ap.add_argument("--first-layer", default="resident")
    ap.add_argument("--memory-budget", default=None)
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args()
    for v in a.variants.split(","):
        chunk, sub = (int(x) for x in v.split(":"))
        g = asyncio.run(one(a, chunk, sub))
        print(
            f"chunk {chunk} (used {g['chunk']}) sub {sub}: MLX peak over active "
            f"{g['mlx_over']:.0f} MiB ({g['mlx_over'] / max(1, g['chunk']):.2f}/chunk token), "
            f"RSS at start {g['rss_start']:.0f}, peak RSS {g['hwm']:.0f} MiB, end: active "
            f"{g['active_end']:.0f} cache {g['cache_end']:.0f} MiB; {g['mib_tok']:.1f} MiB read/"
            f"prompt tok, {g['tps']:.2f} prompt tok/s, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
