r"""Run one prompt over several tier stacks and print the comparison (same model, same tokens).

Every stack serves the same expert bytes, so the generated tokens are identical
(checked: the program exits 1 if a stack's text differs); what changes is
speed, blocked-load time and where reads came from. Prints one row per stack:
tok/s, blocked ms/step, MiB read per token, RAM-cache hit rate, same text.

Run: python examples/compare_tiers.py [MODEL_DIR] [--max-tokens N]   (default: the demo model)

ci-run: --max-tokens 4
ci-run: {model} --max-tokens 4
ci-expect: ^tier stack +tok/s +blocked ms/step +MiB/token +cache hit +same text$
ci-expect: ^ram:4MiB>throttle:preset=usb3>pread +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +yes$
ci-expect: all 5 stacks generated the same tokens
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from _model import parse_args

import edge0

if TYPE_CHECKING:
    from edge0.runtime.engine.summary import RunStats

STACKS = [
    "pread",
    "mmap",
    "ram:4MiB>pread",
    "throttle:preset=sata>pread",
    "ram:4MiB>throttle:preset=usb3>pread",
]
PROMPT = "Explain how a cache works."


async def one(path: Path, tiers: str, max_tokens: int) -> tuple[list[str], RunStats]:
    async with edge0.Engine.open(path, tiers=tiers, mode="hint") as eng:
        pieces = [p async for p in eng.generate(PROMPT, max_tokens=max_tokens)]
    *text, stats = pieces
    assert not isinstance(stats, str)
    return [str(t) for t in text], stats


async def main(path: Path, max_tokens: int) -> int:
    rows, reference = [], None
    for tiers in STACKS:
        text, s = await one(path, tiers, max_tokens)
        reference = reference or text
        same = "yes" if text == reference else "NO"
        rows.append((tiers, s.decode_tps, s.blocked_ms_per_step, s.bytes_per_token / 2**20,
                     s.cache_hit_rate, same))  # fmt: skip
    print(f"{'tier stack':40s} {'tok/s':>7s} {'blocked ms/step':>16s} {'MiB/token':>10s} "
          f"{'cache hit':>9s} {'same text':>9s}")  # fmt: skip
    for tiers, tps, blocked, mib, hit, same in rows:
        print(f"{tiers:40s} {tps:7.1f} {blocked:16.2f} {mib:10.3f} {hit:9.2f} {same:>9s}")
    if any(row[-1] == "NO" for row in rows):
        print("error: the stacks generated different tokens", file=sys.stderr)
        return 1
    print(f"all {len(rows)} stacks generated the same tokens")
    return 0


if __name__ == "__main__":
    args = parse_args(__doc__, max_tokens=24)
    from edge0.loop import run

    sys.exit(run(main(args.model, args.max_tokens)))
