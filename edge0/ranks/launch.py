"""Starting a pipeline from rank 0: plan the split, spawn the other ranks, join the ring
(docs/distributed.md, "Running it"; under `mlx.launch` nothing is spawned here).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypeVar

import attrs

from edge0.errors import ConfigError, RankError
from edge0.layout.manifest import Manifest
from edge0.log import get_logger
from edge0.options.engine import EngineOptions
from edge0.ranks.budget import LayerBytes, rank_plan
from edge0.ranks.build import Node, build_node
from edge0.ranks.hosts import Cluster, parse_hosts
from edge0.ranks.link import PING, STOP, Codec, Link, Message
from edge0.ranks.pipeline import PipelineRunner
from edge0.ranks.plan import Split, plan_split
from edge0.runtime.compute.thread import ComputeThread
from edge0.runtime.plan.memory import MemoryPlan
from edge0.runtime.setup.build import Setup
from edge0.stats import current_rss_bytes

log = get_logger("edge0.ranks.launch")
T = TypeVar("T")
SSH_ENV = "EDGE0_SSH"  # the command that runs a rank on its host: `$EDGE0_SSH HOST 'cd DIR && ...'`
START_TIMEOUT_S = 600.0  # joining the ring and loading every rank's layers
JOINING = "rank_joining"  # a worker's log event just before it joins (edge0.ranks.worker)
_OPENED = False  # whether this process has joined a ring (one per process)


def options_json(opts: EngineOptions) -> str:
    """The options the other ranks run with (JSON; the oracle recording as a list)."""
    if not isinstance(opts.tiers, str):
        raise ConfigError("a pipeline needs tiers as a spec string, not a Tier object")
    d = attrs.asdict(opts, recurse=False)
    d["trace"] = None
    d["hosts"] = None
    if opts.recording is not None:
        d["recording"] = [[p, layer, e] for (p, layer), e in opts.recording.items()]
    return json.dumps(d)


def options_from_json(text: str) -> EngineOptions:
    d = json.loads(text)
    if d.get("recording") is not None:
        d["recording"] = {(p, layer): e for p, layer, e in d["recording"]}
    return EngineOptions(**d)


def split_for(
    path: Path, manifest: Manifest, opts: EngineOptions, size: int, baseline: int = 0
) -> tuple[Split, LayerBytes]:
    """The split (`--layers`, else balanced by each layer's fixed bytes) and the per-layer
    bytes the ranks' memory plans are made from (with this process's `baseline`)."""
    from edge0.ranks.budget import layer_bytes

    lb = layer_bytes(path, manifest, opts, baseline)
    return plan_split(lb.costs(), size, opts.layers), lb


def rank_plans(opts: EngineOptions, lb: LayerBytes, split: Split) -> list[MemoryPlan]:
    """Under `--memory-budget`: every rank's plan (refuses before any rank is started)."""
    assert opts.memory_budget is not None
    plans = [rank_plan(opts.memory_budget, lb, split.ranges, r) for r in range(len(split.ranges))]
    for r, p in enumerate(plans):
        log.info("rank_memory_plan", rank=r, line=p.line())
    return plans


def codec_for(manifest: Manifest, opts: EngineOptions, itemsize: int = 4) -> Codec:
    cfg = manifest.config.get("text_config") or manifest.config
    k = max(opts.top_k or 0, int(cfg.get("num_experts_per_tok") or 1))
    return Codec(k, int(cfg["hidden_size"]), itemsize)


class Launched:
    """Ranks that mlx.launch started (it watches and stops them): nothing to spawn or stop."""

    procs: list[subprocess.Popen[bytes]] = []

    def check(self) -> None:
        pass

    def joining(self) -> bool:
        return True

    def stop(self, grace_s: float = 10.0) -> None:
        pass


class Ranks:
    """The spawned ranks 1..N-1: their processes and log files."""

    def __init__(self, cluster: Cluster, path: Path, opts_text: str, split: Split) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.files: list[Path] = []  # removed after a clean stop (logs kept after a failure)
        logdir = Path(tempfile.mkdtemp(prefix="edge0-ranks-"))
        self.logdir = logdir
        for rank in range(1, cluster.size):
            argv = [
                sys.executable,
                "-m",
                "edge0.ranks.worker",
                str(path.resolve()),
                "--rank",
                str(rank),
                "--ring",
                cluster.ring_json(),
                "--split",
                split.text(),
                "--options",
                opts_text,
            ]
            host = cluster.hosts[rank]
            if not host.local:
                remote = f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(argv)}"
                argv = [*shlex.split(os.environ.get(SSH_ENV, "ssh")), host.ssh, remote]
            logfile = logdir / f"rank{rank}.log"
            self.logs.append(logfile)
            with open(logfile, "wb") as fh:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT
                )
                self.procs.append(proc)

    def check(self) -> None:
        """RankError naming the first rank that exited, with the end of its log."""
        for rank, (p, logfile) in enumerate(zip(self.procs, self.logs, strict=True), start=1):
            if p.poll() is not None:
                tail = logfile.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                raise RankError(
                    f"rank {rank} exited with code {p.returncode} ({tail[0].strip()}); "
                    f"its log: {logfile}"
                )

    def joining(self) -> bool:
        """Whether every rank has logged that it is about to join the ring."""
        return all(JOINING in f.read_text(errors="replace") for f in self.logs)

    def stop(self, grace_s: float = 10.0) -> None:
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def clean(self) -> None:
        """Remove the ring file and the logs (after a clean stop)."""
        for f in [*self.files, *self.logs]:
            f.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.logdir.rmdir()


async def _watch(
    link: Link,
    fut: concurrent.futures.Future[T],
    ranks: Ranks | Launched,
    what: str,
    timeout: float,
) -> T:
    """Wait for a link job without blocking the loop; a rank that exits meanwhile is reported
    at once (the link thread may stay blocked: it is a daemon, the process can still exit)."""
    deadline = time.monotonic() + timeout
    while not fut.done():
        try:
            ranks.check()
        except RankError as exc:
            link.broken = exc
            raise
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    return link.wait(fut, what, 0.0)


async def _join(link: Link, ranks: Ranks | Launched, timeout: float) -> None:
    """Rank 0: join the ring once every rank is about to (mx.distributed.init holds the GIL
    while it waits for its peers, so it must not start before they are there)."""
    deadline = time.monotonic() + timeout
    while not ranks.joining():
        ranks.check()
        if time.monotonic() > deadline:
            raise RankError(f"the ranks did not start within {timeout:g} s; see their logs")
        await asyncio.sleep(0.05)
    await _watch(link, link.start_init(), ranks, "rank 0: joining the ring", timeout)


async def build_pipeline(path: Path, opts: EngineOptions, compute: ComputeThread) -> Setup:
    """Rank 0 of a pipeline: spawn, join, load own layers, wait for every rank; a Setup."""
    from edge0.ranks.hosts import LAUNCHED

    global _OPENED
    assert opts.hosts is not None
    baseline = current_rss_bytes()  # before any weights (each rank measures its own)
    if _OPENED:  # mx.distributed keeps one global group per process
        raise ConfigError(
            "this process already joined a pipeline; open one Engine with hosts= per process"
        )
    manifest = Manifest.load(path)
    link = Link(codec_for(manifest, opts), opts.rank_timeout)
    ranks: Ranks | Launched
    if opts.hosts == LAUNCHED:  # mlx.launch set MLX_RANK / MLX_HOSTFILE and started the others
        ranks = Launched()
        size = int(len(json.loads(Path(os.environ["MLX_HOSTFILE"]).read_text())))
        split, lb = split_for(path, manifest, opts, size, baseline)
    else:
        cluster = parse_hosts(opts.hosts)
        split, lb = split_for(path, manifest, opts, cluster.size, baseline)
        if opts.memory_budget is not None:  # every rank's plan, before any rank is started
            rank_plans(opts, lb, split)
        os.environ["MLX_RANK"] = "0"
        ringfile = Path(tempfile.mkstemp(prefix="edge0-ring-", suffix=".json")[1])
        ringfile.write_text(cluster.ring_json())
        os.environ["MLX_HOSTFILE"] = str(ringfile)
        ranks = Ranks(cluster, path, options_json(opts), split)
        ranks.files.append(ringfile)
    log.info(
        "pipeline",
        ranks=len(split.ranges),
        split=split.text(),
        layers=[f"{r.start}-{r.stop - 1}" for r in split.ranges],
        cost=list(split.cost),
    )
    try:
        setup, node = await build_node(path, opts, split, 0, link, compute, baseline, lb)
        _OPENED = True
        await _join(link, ranks, START_TIMEOUT_S)  # after loading, as the other ranks do
        await _ready(link, node, ranks)
    except BaseException:
        link.close()
        ranks.stop(grace_s=0.0)
        raise
    return _wire(setup, node, ranks, link)


async def _ready(link: Link, node: Node, ranks: Ranks | Launched) -> None:
    """One empty trip around the ring once every rank has loaded (a long timeout)."""
    link.send(1, Message(PING), "rank 0: ping")
    await _watch(
        link,
        link.start_recv(node.size - 1),
        ranks,
        "rank 0: waiting for every rank to load",
        START_TIMEOUT_S,
    )


def _wire(setup: Setup, node: Node, ranks: Ranks | Launched, link: Link) -> Setup:
    setup.runner = lambda request, sampler, settings: PipelineRunner(
        node, request, sampler, settings
    )
    setup.dist = node
    node.procs = ranks.procs

    async def close() -> None:
        if link.broken is None:
            try:
                await asyncio.to_thread(_stop, node)
            except RankError as exc:
                log.warning("rank_stop_failed", error=str(exc))
        link.close()
        await asyncio.to_thread(ranks.stop, 0.0 if link.broken is not None else 10.0)
        if link.broken is None and isinstance(ranks, Ranks):
            ranks.clean()

    setup.on_close.append(close)
    return setup


def _stop(node: Node) -> None:
    node.link.send(1, Message(STOP), "rank 0: stopping rank 1")
    node.link.recv(node.size - 1, "rank 0: waiting for the ranks to stop")


def node_of(engine: Any) -> Node:
    """The pipeline node of an Engine opened with hosts= (for stats and benchmarks)."""
    node = getattr(engine.setup, "dist", None)
    if node is None:
        raise ConfigError("this engine runs on one machine (open it with hosts=...)")
    return node
