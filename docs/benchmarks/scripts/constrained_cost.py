"""CPU cost per token of constrained decoding against free decoding, same model, same steps.

Runs one Engine (the demo model unless MODEL is given) and decodes the same prompt
with the same seed in three variants, interleaved round by round: `free` (no hooks),
`json` (a JSON-schema token mask from llguidance, as `response_format` sets it; the
schema is one long string so the answer never ends early) and `logprobs` (top-5
log-probabilities recorded per token, no mask). Per request: process CPU seconds
(every thread) per generated token, and decode tok/s. Medians, per-round ratios
against `free`, and the load average go into one JSON file.

Run: python docs/benchmarks/scripts/constrained_cost.py [MODEL] --rounds 5 --tokens 64 \
        --out docs/benchmarks/results/constrained-cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from edge0.model.generate import SamplingSettings
from edge0.runtime.engine.api import Engine
from edge0.server.decoding import Decoding, Grammars

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
VARIANTS = ("free", "json", "logprobs")


def _hooks(variant: str, grammars: Grammars, grammar: str) -> Decoding | None:
    if variant == "json":
        return Decoding(grammars, grammar)
    if variant == "logprobs":
        return Decoding(top_logprobs=5)
    return None


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from edge0.model.demo import default_model_path

    model = args.model or default_model_path()
    async with Engine.open(model, tiers=args.tiers, mode=args.mode) as eng:
        tok = eng.tokenizer
        config = eng.setup.manifest.config
        vocab = int((config.get("text_config") or config)["vocab_size"])
        grammars = Grammars(tok, vocab, list(tok.eos_token_ids))
        grammar = grammars.check(Grammars.json_grammar(SCHEMA), "response_format")
        ids = tok.apply_chat_template(
            [{"role": "user", "content": "Say it as JSON."}], add_generation_prompt=True
        )
        rows: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds + 1):  # round 0 warms up
            for variant in VARIANTS if r % 2 else reversed(VARIANTS):
                settings = SamplingSettings(
                    max_tokens=args.tokens,
                    temp=1.0,
                    seed=r,
                    hooks=_hooks(variant, grammars, grammar),
                )
                stats: list[Any] = []
                c0, t0, n = time.process_time(), time.perf_counter(), 0
                async for _ in eng.tokens(
                    ids, max_tokens=args.tokens, sampling=settings, stop=False, stats_to=stats
                ):
                    n += 1
                cpu, wall = time.process_time() - c0, time.perf_counter() - t0
                if r:
                    rows[variant].append(
                        {
                            "tokens": n,
                            "cpu_ms_per_token": cpu / n * 1e3,
                            "wall_s": wall,
                            "decode_tps": stats[0].decode_tps,
                        }
                    )
    name = args.model.name if args.model else "demo"
    out: dict[str, Any] = {
        "model": name,
        "mode": args.mode,
        "tiers": args.tiers,
        "vocab": vocab,
        "tokens": args.tokens,
        "rows": rows,
    }
    for v in VARIANTS:
        out[f"{v}_cpu_ms_per_token_median"] = statistics.median(
            x["cpu_ms_per_token"] for x in rows[v]
        )
        out[f"{v}_decode_tps_median"] = statistics.median(x["decode_tps"] for x in rows[v])
        out[f"{v}_cpu_ratio_per_round"] = [
            a["cpu_ms_per_token"] / b["cpu_ms_per_token"]
            for a, b in zip(rows[v], rows["free"], strict=True)
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--tiers", default="ram:64MiB>pread")
    ap.add_argument("--mode", default="route")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    result = asyncio.run(bench(args))
    result["load_before"], result["load_after"] = (
        load0,
        Path("/proc/loadavg").read_text().split()[:3],
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
