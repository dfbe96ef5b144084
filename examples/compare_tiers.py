"""Run one prompt over several tier stacks and print the comparison (same model, same tokens).

Every stack serves the same expert bytes, so the generated tokens are identical
(checked); what changes is speed, blocked-load time and where reads came from.

Run: python examples/compare_tiers.py [MODEL_DIR]   (default: a tiny demo model)
"""

from __future__ import annotations

from typing import Any

from _model import model_dir

import edge0
from edge0.runtime.engine import run
from edge0.runtime.summary import RunStats

STACKS = [
    "pread",
    "mmap",
    "ram:4MiB>pread",
    "throttle:preset=sata>pread",
    "ram:4MiB>throttle:preset=usb3>pread",
]
PROMPT = "Explain how a cache works."


async def one(path: Any, tiers: str) -> tuple[list[str], RunStats]:
    async with edge0.Engine.open(path, tiers=tiers, mode="hint") as eng:
        pieces = [p async for p in eng.generate(PROMPT, max_tokens=24)]
    *text, stats = pieces
    assert isinstance(stats, RunStats)
    return [str(t) for t in text], stats


async def main() -> None:
    path = model_dir()
    rows, reference = [], None
    for tiers in STACKS:
        text, s = await one(path, tiers)
        reference = reference or text
        same = "yes" if text == reference else "NO"
        rows.append((tiers, s.decode_tps, s.blocked_ms_per_step, s.bytes_per_token / 2**20,
                     s.cache_hit_rate, same))  # fmt: skip
    print(f"{'tier stack':40s} {'tok/s':>7s} {'blocked ms/step':>16s} {'MiB/token':>10s} "
          f"{'cache hit':>9s} {'same text':>9s}")  # fmt: skip
    for tiers, tps, blocked, mib, hit, same in rows:
        print(f"{tiers:40s} {tps:7.1f} {blocked:16.2f} {mib:10.3f} {hit:9.2f} {same:>9s}")


if __name__ == "__main__":
    run(main())
