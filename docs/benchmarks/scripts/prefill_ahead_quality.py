"""How well a chunk's read-ahead predicts the next layer's union: router vs heads (no timing).

For each `--overlap` variant, one Engine (route mode) runs one prompt in chunks
of `--chunk` with routing recorded; every early read of a chunk
(edge0.runtime.prefill.chunks.OVERLAP) is compared with the next layer's true union
for that chunk. Prints, per variant: the experts read early, how many were in
the true union, and per early read the mean true union, the mean number of
distinct experts predicted for the chunk and how many of those are the ones
kept for the first decode step (never read early: they are staged last).
Reads go through plain `pread`: this counts predictions, it does not time them.

Usage: .venv/bin/python docs/benchmarks/scripts/prefill_ahead_quality.py MODEL --prompt-len 128
       --chunk 16 [--overlap router,heads] [--predictor heads] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import numpy as np

from edge0.bench.worker import encode_prompts
from edge0.runtime.engine.api import Engine
from edge0.runtime.prefill import chunks as prefill
from edge0.runtime.prefill.chunks import ChunkState

PREFETCH, NEXT_UNION = ChunkState.prefetch, prefill.next_union


async def one(
    model: str, n: int, chunk: int, k: int, overlap: str, predictor: str | None
) -> dict[str, Any]:
    """Early reads of one prompt with `overlap`, scored against the recorded routing."""
    early: list[tuple[int, int, list[int], int, int]] = []
    predicted: dict[int, set[int]] = {}

    def next_union(ov: str, block: Any, following: Any, x: Any, inds: Any) -> Any:
        got = NEXT_UNION(ov, block, following, x, inds)
        if got is not None:  # evaluated here: a counting run, not a timed one
            predicted[following.layer] = set(np.array(got).reshape(-1).tolist())
        return got

    def prefetch(self: ChunkState, layer: int, experts: list[int], ahead: int = 1) -> None:
        if ahead == 0:
            kept = set(self.decode_set(layer) or [])
            guess = predicted[layer]
            early.append((self.start, layer, list(experts), len(guess), len(guess & kept)))
        PREFETCH(self, layer, experts, ahead)

    prefill.OVERLAP, prefill.next_union, ChunkState.prefetch = overlap, next_union, prefetch
    try:
        async with Engine.open(
            model,
            mode="route",
            top_k=k,
            tiers="pread",
            prefill_chunk=chunk,
            predictor=predictor,
            record_routing=True,
        ) as eng:
            ids = encode_prompts(eng.tokenizer, 1, n)[0]
            async for _ in eng.tokens(ids, max_tokens=1, stop=False):
                pass
            rec = eng.setup.ctx.recording
    finally:
        prefill.next_union, ChunkState.prefetch = NEXT_UNION, PREFETCH
    hits, unions = 0, []
    for start, layer, experts, _, _ in early:
        union = {e for p in range(start, min(start + chunk, n)) for e in rec[(p, layer)]}
        unions.append(len(union))
        hits += sum(e in union for e in experts)
    read = sum(len(e[2]) for e in early)
    return {
        "overlap": overlap,
        "early_reads": len(early),
        "experts_read_early": read,
        "in_true_union": hits,
        "true_union": float(np.mean(unions)) if unions else 0.0,
        "predicted_distinct": float(np.mean([e[3] for e in early])) if early else 0.0,
        "predicted_kept": float(np.mean([e[4] for e in early])) if early else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--overlap", default="router,heads")
    ap.add_argument("--predictor", default=None, help="route mode's predictor (default: Engine's)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    runs = []
    for ov in a.overlap.split(","):
        r = asyncio.run(one(a.model, a.prompt_len, a.chunk, a.k, ov, a.predictor))
        runs.append(r)
        share = r["in_true_union"] / max(r["experts_read_early"], 1)
        print(
            f"{ov}: {r['early_reads']} early reads, {r['experts_read_early']} experts read "
            f"early, {r['in_true_union']} in the true union ({share:.1%}); per early read: "
            f"true union {r['true_union']:.1f}, predicted distinct {r['predicted_distinct']:.1f}"
            f", of them kept for decode {r['predicted_kept']:.1f}",
            flush=True,
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
