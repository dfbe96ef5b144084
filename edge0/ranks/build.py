"""Building one rank: its layers, predictor heads, slot table, tier stack and scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ConfigError
from edge0.families import family_for
from edge0.layout.manifest import Manifest
from edge0.layout.safetensors_io import MX_DTYPES
from edge0.log import get_logger
from edge0.model.loaded import activation_dtype
from edge0.model.sparse import sparse_blocks
from edge0.options.engine import EngineOptions
from edge0.ranks.budget import LayerBytes, layer_bytes, rank_plan
from edge0.ranks.link import Link
from edge0.ranks.pipeline import StageScheduler
from edge0.ranks.plan import Split
from edge0.ranks.stage import Stage, load_stage
from edge0.routing.predictors import Predictor
from edge0.routing.prerouter import PrerouterSet
from edge0.runtime.compute.steps import Steps
from edge0.runtime.compute.thread import ComputeThread
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.slots import SlotPool, pool_size
from edge0.runtime.io.trace import Tracer
from edge0.runtime.layers.streams import LayerStream, Lookahead, ResidentExperts
from edge0.runtime.plan.memory import with_ram
from edge0.runtime.setup.build import Setup
from edge0.runtime.setup.prepare import (
    choose_predictor,
    install_streams,
    kept_layers,
    make_streams,
    model_top_k,
    resident_stacks,
    slot_dtypes,
)
from edge0.storage.spec import open_tiers

log = get_logger("edge0.ranks.build")


@attrs.define
class Node:
    """One rank of the pipeline, as its compute thread sees it."""

    rank: int
    size: int
    split: Split
    stage: Stage
    ctx: Steps
    link: Link
    d_model: int
    dtype: mx.Dtype
    entry: int | None = None  # own first streamed layer, predicted by the previous rank
    exit_to: int | None = None  # the next rank's layer that this rank's last head predicts
    wrap_to: int | None = None  # rank 0: own first layer, predicted by the last rank (wrap)
    procs: list[Any] = attrs.Factory(list)  # rank 0: the processes of the ranks it spawned
    part: Any = None  # rank 0: the StageRunner of the latest request (its stats)
    n_slots: int = 0  # this rank's slot pool
    load_read: int = -1  # bytes this process read while loading its layers (-1: unknown)


def _predictor(model: nn.Module, opts: EngineOptions, path: Path) -> tuple[int, Predictor | None]:
    """Before pruning: top-k and the predictor over all MoE layers (heads read the routers)."""
    blocks = sparse_blocks(model)
    k = opts.top_k or model_top_k(model, blocks[0][2])
    return k, choose_predictor(model, [i for i, _, _ in blocks], opts, path)


def load_node(
    path: Path,
    manifest: Manifest,
    opts: EngineOptions,
    split: Split,
    rank: int,
    link: Link,
    tracer: Tracer,
    n_slots: int | None = None,
) -> tuple[Node, Any, SlotMemory | None, SlotPool | None]:
    """On the compute thread: load this rank's layers and install its streaming blocks."""
    size = len(split.ranges)
    own = split.ranges[rank]
    experts = "resident" if opts.mode == "resident" else "none"
    stage, (k, predictor), tokenizer = load_stage(
        path,
        manifest,
        own,
        rank == 0,
        rank == size - 1,
        experts,
        opts.adapter,
        lambda m: _predictor(m, opts, path),
    )
    if k > manifest.n_experts:
        raise ConfigError(f"--top-k {k} exceeds the {manifest.n_experts} experts per layer")
    config = manifest.config.get("text_config") or manifest.config
    # the hidden state's dtype: the compute dtype the loader cast to (not a kept narrower one)
    dtype = activation_dtype(MX_DTYPES[manifest.float_dtype])
    node = Node(
        rank,
        size,
        split,
        stage,
        Steps(opts.run_mode, k, tracer),
        link,
        int(config["hidden_size"]),
        dtype,
    )
    blocks = sparse_blocks(stage.model)
    family = family_for(manifest.model_type)
    if opts.mode == "resident":
        for _, _, block in blocks:
            family.set_top_k(block, k)
        return node, tokenizer, None, None
    all_moe = list(manifest.moe_layers)
    keep = kept_layers(all_moe, opts)
    streamed = [i for i, _, _ in blocks if i not in keep]
    # one pool shared by this rank's streamed layers (sized by the rank's memory plan if any)
    n_slots = n_slots or pool_size(k, len(streamed))
    memory = SlotMemory(manifest, streamed, n_slots, slot_dtypes(stage.model, manifest))
    table = SlotPool(streamed, n_slots)
    steps = Steps(opts.run_mode, k, tracer, predictor=predictor, memory=memory)
    node.ctx = steps
    node.entry = streamed[0] if streamed else None
    for i in keep:
        if i in own:
            steps.resident_experts[i] = resident_stacks(path, manifest, i)
    if opts.record_routing:
        steps.recording = {}
    streams = make_streams(
        [i for i, _, _ in blocks], steps, memory, manifest, opts.run_mode, opts.overlap
    )
    if predictor is not None:
        _wire_heads(
            node,
            predictor,
            streams,
            [i for i in all_moe if i not in keep],
            manifest.quantization,
            opts.first_layer == "wrap",
        )
    install_streams(stage.model, blocks, family, steps, streams)
    return node, tokenizer, memory, table


def _wire_heads(
    node: Node,
    predictor: Predictor,
    streams: dict[int, LayerStream],
    streamed: list[int],
    quant: dict[str, Any],
    wrap: bool,
) -> None:
    """The heads this rank owns whose targets are streamed somewhere; a head whose target is
    on another rank predicts into a stand-in stream (its prefetch goes to the outbox)."""
    own, steps = node.split.ranges[node.rank], node.ctx
    predictor.targets = {a: b for a, b in predictor.targets.items() if a in own and b in streamed}
    heads = getattr(predictor, "heads", None)
    if isinstance(heads, PrerouterSet):  # free the heads other ranks own
        heads.heads = {a: h for a, h in heads.heads.items() if a in own}
    remote = {b for b in predictor.targets.values() if b not in own}
    if len(remote) > 1:
        raise ConfigError(f"rank {node.rank}: heads predict layers {sorted(remote)} elsewhere")
    node.exit_to = next(iter(remote), None)
    for owner, target in predictor.targets.items():
        stream = streams.get(target) or LayerStream(target, steps, ResidentExperts({}), quant)
        streams[owner].head = Lookahead(owner, predictor, stream, steps)
    if wrap and node.rank == 0 and streamed and streamed[0] in own:
        node.wrap_to = streamed[0]  # predicted by the last rank's wrap-around head


def read_bytes() -> int:
    """Bytes this process has read through read()/pread() so far (Linux /proc/self/io; MLX
    reads safetensors that way), or -1 where the counter is missing (macOS)."""
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


async def build_node(
    path: Path,
    opts: EngineOptions,
    split: Split,
    rank: int,
    link: Link,
    compute: ComputeThread,
    baseline: int,
    lb: LayerBytes | None = None,
) -> tuple[Setup, Node]:
    """Load rank `rank` and open its tier stack and scheduler; under `--memory-budget`, the
    rank's own plan (from `baseline`, its RSS before loading) sizes its slot pool and RAM
    cache, and a budget it cannot hold is refused before anything is loaded."""
    manifest = Manifest.load(path)
    tracer = Tracer(chrome=opts.trace is not None)
    spec, mplan = opts.tiers, None
    if opts.memory_budget is not None:
        lb = lb or layer_bytes(path, manifest, opts, baseline)
        mplan = rank_plan(opts.memory_budget, lb, split.ranges, rank)
        if isinstance(spec, str):
            spec = with_ram(spec, mplan.cache)
        log.info("memory_plan", rank=rank, line=mplan.line(), tiers=spec)
    n_slots = mplan.n_slots if mplan is not None and mplan.n_slots else None
    read0 = read_bytes()
    node, tokenizer, memory, table = await compute.run(
        lambda: load_node(path, manifest, opts, split, rank, link, tracer, n_slots)
    )
    node.load_read = read_bytes() - read0 if read0 >= 0 else -1
    setup = Setup(opts, path, node.stage.model, tokenizer, manifest, node.ctx, tracer)
    setup.memory_plan = mplan
    if memory is None or table is None:
        return setup, node
    node.n_slots = table.n_slots
    setup.tier = open_tiers(spec, path, manifest)
    remote = set(manifest.moe_layers) - set(table.layers)
    setup.scheduler = StageScheduler.build(
        setup.tier, memory, table, tracer, opts.io_workers, remote
    )
    node.ctx.attach(setup.scheduler)
    return setup, node
