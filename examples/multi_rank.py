r"""One model pipelined over two local ranks (mlx.distributed, ring backend on 127.0.0.1).

Rank 0 is this process: `Engine.open(path, hosts=2)` spawns rank 1, splits the
layers between the two (balancing the memory each rank must hold), gives each
rank its own 1 GiB memory budget, and each rank streams only its own layers'
experts. The same Engine API as on one machine. Prints the split, rank 0's memory
plan, the text, each rank's stats (layers, peak RSS, compute-thread CPU,
blocked-on-reads time, expert reads, bytes read while loading, the layers whose
experts it read), then the ring's cost per token; exits 0.

Run: python examples/multi_rank.py [MODEL_DIR] [--max-tokens N]   (default: the demo model)
On several Macs: docs/distributed.md.

ci-run: --max-tokens 6
ci-run: {model} --max-tokens 6
ci-expect: ^layers per rank: \d+,\d+ \(0-\d+, \d+-\d+\)$
ci-expect: ^rank 0 memory plan: memory budget 1024 MiB = resident \d+ \+
ci-expect: ^\d+ tokens, [\d.]+ tok/s decode$
ci-expect: ^rank 0: layers 0-\d+, peak RSS \d+ MiB, .* expert reads
ci-expect: ^rank 1: layers \d+-\d+, peak RSS \d+ MiB, .* expert reads
ci-expect: ^ring: \d+ bytes per token over 2 hops, empty trip [\d.]+ ms
"""

from __future__ import annotations

import statistics
from pathlib import Path

from _model import parse_args

import edge0


async def main(path: Path, max_tokens: int) -> None:
    from edge0.ranks.launch import node_of
    from edge0.ranks.pipeline import gather_stats, ping
    from edge0.runtime.engine.summary import RunStats

    async with edge0.Engine.open(
        path, hosts=2, mode="route", tiers="pread", memory_budget="1GiB"
    ) as eng:  # per rank
        node = node_of(eng)
        print(
            f"layers per rank: {node.split.text()} "
            f"({', '.join(f'{r.start}-{r.stop - 1}' for r in node.split.ranges)})"
        )
        assert eng.setup.memory_plan is not None
        print(f"rank 0 memory plan: {eng.setup.memory_plan.line()}")
        async for piece in eng.generate("def parse(s):", max_tokens=max_tokens):
            if isinstance(piece, RunStats):
                print(f"\n{piece.generated_tokens} tokens, {piece.decode_tps:.1f} tok/s decode")
            else:
                print(piece, end="", flush=True)
        for s in await eng._compute.run(lambda: gather_stats(node)):
            rng = node.split.ranges[int(s["rank"])]
            print(
                f"rank {int(s['rank'])}: layers {rng.start}-{rng.stop - 1}, peak RSS "
                f"{s['peak_rss_mib']:.0f} MiB, compute {s['cpu_s'] * 1e3:.0f} ms CPU, "
                f"blocked on reads {s['wait_s'] * 1e3:.1f} ms, {int(s['reads'])} expert reads "
                f"({s['read_mib']:.2f} MiB, layers {int(s['read_layer_min'])}-"
                f"{int(s['read_layer_max'])}), read {s['load_read_mib']:.1f} MiB while "
                "loading"
            )
        trips = await eng._compute.run(lambda: ping(node, 20))
        print(
            f"ring: {node.size * node.link.codec.nbytes} bytes per token over {node.size} hops, "
            f"empty trip {statistics.median(trips) * 1e3:.2f} ms (median of 20)"
        )


if __name__ == "__main__":
    from edge0.loop import run

    args = parse_args(__doc__, max_tokens=32)
    run(main(args.model, args.max_tokens))
