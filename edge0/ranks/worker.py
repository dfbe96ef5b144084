"""A rank > 0 of a pipeline: `python -m edge0.ranks.worker MODEL --rank R --ring JSON ...`
(docs/distributed.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from edge0.errors import Edge0Error, RankError
from edge0.layout.manifest import Manifest
from edge0.log import get_logger
from edge0.loop import run as run_async
from edge0.options.engine import EngineOptions
from edge0.ranks.build import build_node
from edge0.ranks.link import Link
from edge0.ranks.pipeline import serve
from edge0.ranks.plan import Split
from edge0.routing.validation import with_mode
from edge0.runtime.compute.thread import ComputeThread
from edge0.stats import current_rss_bytes

log = get_logger("edge0.ranks.worker")


async def work(path: Path, opts: EngineOptions, rank: int, split: Split | None) -> None:
    """Join the ring as `rank` (MLX_RANK / MLX_HOSTFILE set), load, serve until STOP."""
    from edge0.ranks.launch import JOINING, START_TIMEOUT_S, codec_for, split_for

    baseline = current_rss_bytes()  # before any weights: this rank's memory plan starts here
    manifest = Manifest.load(path)
    link = Link(codec_for(manifest, opts), opts.rank_timeout)
    compute = ComputeThread()
    try:
        # load first, join after: ranks that join the ring at about the same time connect at
        # once (the ring backend retries a refused connection with a growing back-off)
        size = len(json.loads(Path(os.environ["MLX_HOSTFILE"]).read_text()))
        split = split or split_for(path, manifest, opts, size, baseline)[0]
        setup, node = await build_node(path, opts, split, rank, link, compute, baseline)
        log.info(JOINING, rank=rank)  # rank 0 waits for this line in our log before it joins
        link.init(START_TIMEOUT_S, f"rank {rank}: joining the ring")
        if setup.scheduler is not None:
            await setup.scheduler.start()
        log.info(
            "rank_ready",
            rank=rank,
            layers=f"{split.ranges[rank].start}-{split.ranges[rank].stop - 1}",
        )
        try:
            await compute.run(lambda: serve(node))
        finally:
            if setup.scheduler is not None:
                await setup.scheduler.aclose()
            if setup.tier is not None:
                await setup.tier.aclose()
    finally:
        link.close()
        compute.close()


def main(argv: list[str] | None = None) -> int:
    """Join the ring, load this rank's layers, run steps as rank 0's messages arrive until it
    stops the ring. Exit code 0 after STOP, 1 when a neighbour fails (its error logged), 2
    for bad options."""
    from edge0 import log as edge0_log
    from edge0.ranks.launch import options_from_json
    from edge0.ranks.plan import _n_layers, parse_layers

    p = argparse.ArgumentParser(prog="edge0.ranks.worker")
    p.add_argument("model")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--ring", required=True, help="the ring backend's address list (JSON)")
    p.add_argument("--split", required=True, help="layers per rank, e.g. 4,4")
    p.add_argument("--options", required=True, help="EngineOptions as JSON")
    args = p.parse_args(argv)
    edge0_log.configure("info")
    fd, ring = tempfile.mkstemp(prefix="edge0-ring-", suffix=".json")
    os.write(fd, args.ring.encode())
    os.close(fd)
    os.environ["MLX_HOSTFILE"], os.environ["MLX_RANK"] = ring, str(args.rank)
    path = Path(args.model)
    try:
        opts = options_from_json(args.options)
        size = args.split.count(",") + 1
        split = parse_layers(args.split, _n_layers(Manifest.load(path)), size)
        run_async(work(path, opts, args.rank, split))
    except RankError as exc:
        log.error("rank_exit", rank=args.rank, error=str(exc))
        return 1
    except Edge0Error as exc:
        where = "" if str(exc).startswith(f"rank {args.rank} ") else f"rank {args.rank}: "
        print(f"edge0: error: {where}{exc}", file=sys.stderr)
        return 2
    finally:
        os.unlink(ring)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def worker_from_cli(path: Path, engine: dict[str, Any]) -> bool:
    """`edge0 run` under mlx.launch: on a rank > 0, serve as a worker (True); rank 0: False.

    `engine` holds `Engine.open`'s keywords from the command line; a worker takes them all
    but the trace (rank 0 writes it) and the hosts (it is one of them)."""
    from edge0.ranks.hosts import LAUNCHED, launched_rank

    rank = launched_rank()
    if engine.get("hosts") != LAUNCHED or rank is None or rank == 0:
        return False
    asked = EngineOptions(**{k: v for k, v in engine.items() if k not in ("trace", "hosts")})
    opts = with_mode(asked, path)  # as rank 0 decides it
    opts.check()
    try:
        run_async(work(path, opts, rank, None))
    except RankError as exc:
        log.error("rank_exit", rank=rank, error=str(exc))
        sys.exit(1)
    return True
