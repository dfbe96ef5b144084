r"""Run one prompt over several tier stacks, in interleaved rounds, and print the comparison.

Every stack serves the same expert bytes, so the generated tokens are identical
(checked: the program exits 1 if a stack's text differs); what changes is
speed, blocked-load time and where reads came from. A single run says little on a
busy machine (two back-to-back runs of one stack can differ tenfold), so each
visit opens the stack, decodes an unmeasured warm-up request, then the measured
one; the rounds visit the stacks in turn (A B C ... A B C ...), each round
starting one stack later. Prints one row per stack: the median decode tok/s over
the rounds with its spread (min-max), and the medians of blocked ms/step, MiB
read per token and RAM-cache hit rate.

Run: python examples/compare_tiers.py [MODEL_DIR] [--max-tokens N] [--rounds R]
     (default: the demo model, 24 tokens, 3 rounds)

ci-run: --max-tokens 4 --rounds 2
ci-run: {model} --max-tokens 4 --rounds 2
ci-expect: ^tier stack +tok/s +spread +blocked ms/step +MiB/token +cache hit +same text$
ci-expect: ^ram:4MiB>throttle:preset=usb3>pread +[\d.]+ +[\d.]+-[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +yes$
ci-expect: ^all 5 stacks generated the same tokens in each of 2 rounds$
ci-bad-args: --no-such-option
ci-bad-args: /no/such/model-dir
ci-bad-args: {hf}
ci-bad-args: {broken}
ci-bad-args: --rounds 0
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from _model import parser, positive, resolve_model

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
WARMUP_TOKENS = 4


async def visit(path: Path, tiers: str, max_tokens: int) -> tuple[list[str], RunStats]:
    """Open the stack, decode a warm-up request (not measured), then the measured one."""
    async with edge0.Engine.open(path, tiers=tiers, mode="hint") as eng:
        async for _ in eng.generate(PROMPT, max_tokens=WARMUP_TOKENS):
            pass
        pieces = [p async for p in eng.generate(PROMPT, max_tokens=max_tokens)]
    *text, stats = pieces
    assert not isinstance(stats, str)
    return [str(t) for t in text], stats


async def main(path: Path, max_tokens: int, rounds: int) -> int:
    runs: dict[str, list[RunStats]] = {s: [] for s in STACKS}
    reference, same = None, {s: True for s in STACKS}
    for r in range(rounds):
        for tiers in STACKS[r % len(STACKS) :] + STACKS[: r % len(STACKS)]:
            text, stats = await visit(path, tiers, max_tokens)
            reference = reference or text
            same[tiers] = same[tiers] and text == reference
            runs[tiers].append(stats)
    print(
        f"{'tier stack':40s} {'tok/s':>7s} {'spread':>11s} {'blocked ms/step':>16s} "
        f"{'MiB/token':>10s} {'cache hit':>9s} {'same text':>9s}"
    )
    for tiers, got in runs.items():
        tps = [s.decode_tps for s in got]
        spread = f"{min(tps):.1f}-{max(tps):.1f}"
        blocked = statistics.median(s.blocked_ms_per_step for s in got)
        mib = statistics.median(s.bytes_per_token for s in got) / 2**20
        hit = statistics.median(s.cache_hit_rate for s in got)
        print(
            f"{tiers:40s} {statistics.median(tps):7.1f} {spread:>11s} {blocked:16.2f} "
            f"{mib:10.3f} {hit:9.2f} {'yes' if same[tiers] else 'NO':>9s}"
        )
    if not all(same.values()):
        print("error: the stacks generated different tokens", file=sys.stderr)
        return 1
    print(f"all {len(STACKS)} stacks generated the same tokens in each of {rounds} rounds")
    return 0


if __name__ == "__main__":
    p = parser(__doc__, max_tokens=24)
    p.add_argument(
        "--rounds", type=positive, default=3, help="interleaved rounds over the stacks (default 3)"
    )
    args = p.parse_args()
    model = resolve_model(p, args.model)
    from edge0.loop import run

    sys.exit(run(main(model, args.max_tokens, args.rounds)))
