"""One model pipelined over two local ranks (mlx.distributed, ring backend on 127.0.0.1).

Rank 0 is this process: `Engine.open(path, hosts=2)` spawns rank 1, splits the
layers between the two (balancing resident + streamed memory), and each rank
streams only its own layers' experts. The same Engine API as on one machine;
the text, then each rank's stats (layers, peak RSS, compute, blocked-on-reads
time, expert reads), then the ring's cost per token. Exits 0.

Run: python examples/multi_rank.py [MODEL_DIR]   (default: the demo model)
On several Macs: docs/distributed.md.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import edge0
from edge0.dist.launch import node_of
from edge0.dist.pipeline import gather_stats, ping
from edge0.runtime.engine import run
from edge0.runtime.summary import RunStats


def model_dir() -> Path:
    """argv[1], else the demo model (converted to the edge0 layout on first use)."""
    from edge0.model.demo import default_model_path

    return Path(sys.argv[1]) if len(sys.argv) > 1 else default_model_path()


async def main() -> None:
    async with edge0.Engine.open(model_dir(), hosts=2, mode="route", tiers="pread") as eng:
        node = node_of(eng)
        print(f"layers per rank: {node.split.text()}  "
              f"({', '.join(f'{r.start}-{r.stop - 1}' for r in node.split.ranges)})")
        async for piece in eng.generate("def parse(s):", max_tokens=32):
            if isinstance(piece, RunStats):
                print(f"\n{piece.generated_tokens} tokens, {piece.decode_tps:.1f} tok/s decode")
            else:
                print(piece, end="", flush=True)
        for s in await eng._compute.run(lambda: gather_stats(node)):
            rng = node.split.ranges[int(s["rank"])]
            print(f"rank {int(s['rank'])}: layers {rng.start}-{rng.stop - 1}, peak RSS "
                  f"{s['peak_rss_mib']:.0f} MiB, compute {s['cpu_s'] * 1e3:.0f} ms CPU, "
                  f"blocked on reads {s['wait_s'] * 1e3:.1f} ms, {int(s['reads'])} expert reads "
                  f"({s['read_mib']:.2f} MiB)")
        trips = await eng._compute.run(lambda: ping(node, 20))
        print(f"ring: {node.size * node.link.codec.nbytes} bytes per token over {node.size} hops, "
              f"empty trip {statistics.median(trips) * 1e3:.2f} ms (median of 20)")


if __name__ == "__main__":
    run(main())
