"""Making a loaded model stream: predictor, slot memory, one stream per layer, streaming blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ConfigError
from edge0.families import family_for, for_model
from edge0.kernels.layers import use_native
from edge0.layout.manifest import Manifest
from edge0.model.loaded import activation_dtype
from edge0.model.sparse import sparse_blocks
from edge0.options.engine import SYNC_EVERY, EngineOptions
from edge0.routing.predictors import Predictor, make_predictor
from edge0.routing.prerouter import PrerouterSet
from edge0.runtime.compute.steps import Steps
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.slots import SlotPool, pool_size
from edge0.runtime.io.trace import Tracer
from edge0.runtime.layers.block import StreamingMoE
from edge0.runtime.layers.policy import (
    DEFAULT_DEADLINE_MS,
    RoutePolicy,
    layer_heads_for,
    route_slots,
)
from edge0.runtime.layers.streams import (
    LayerStream,
    Lookahead,
    ResidentExperts,
    RoutedStream,
    SlotExperts,
)
from edge0.runtime.layers.syncs import SyncGroups
from edge0.runtime.layers.width import Width, room
from edge0.runtime.plan.footprint import batch_k


def model_top_k(model: nn.Module, block: nn.Module) -> int:
    """The model's own top-k, as its family reads it from a sparse block."""
    return for_model(model).top_k(block)


def prepare(
    model: nn.Module,
    manifest: Manifest,
    opts: EngineOptions,
    model_dir: Path | None,
    tracer: Tracer,
    n_slots: int | None = None,
    more_resident: int = 0,
) -> tuple[Steps, SlotMemory | None, SlotPool | None]:
    """On the compute thread: predictor, slot memory, one stream per layer, streaming blocks.

    The mode is decided here, once: which stream class each layer gets, which
    layers own a prediction, where each layer's experts are. `more_resident`: streamed
    layers the memory plan made resident (`kept_layers`).
    """
    blocks = sparse_blocks(model)
    layers = [i for i, _, _ in blocks]
    k = opts.top_k or model_top_k(model, blocks[0][2])
    if k > manifest.n_experts:
        raise ConfigError(f"--top-k {k} exceeds the {manifest.n_experts} experts per layer")
    family = family_for(manifest.model_type)
    family.check_top_k(k)
    if opts.mode == "resident":
        for _, _, block in blocks:
            family.set_top_k(block, k)  # the block's and its router's, where it keeps one
        return Steps("resident", k, tracer), None, None
    predictor = choose_predictor(model, layers, opts, model_dir)
    layer_heads = (
        layer_heads_for(model_dir, model) if opts.route_policy == "deadline" else None
    )  # read from the routers before the blocks are replaced
    keep = kept_layers(layers, opts, more_resident)
    streamed = [i for i in layers if i not in keep]
    base = pool_size(batch_k(k, opts.max_batch, manifest.n_experts), len(streamed))
    grouped = opts.mode == "route" and (opts.sync_every or SYNC_EVERY) > 1
    n_slots = n_slots or route_slots(
        opts.route_policy,
        opts.route_deadline_ms,
        grouped,
        base,
        k,
        manifest.n_experts,
        len(streamed),
        manifest.record_size,
    )
    memory, table = None, None  # every layer resident (the memory plan's): no pool, no reads
    if streamed:
        memory = SlotMemory(manifest, streamed, n_slots, slot_dtypes(model, manifest))
        table = SlotPool(streamed, n_slots)
    steps = Steps(opts.run_mode, k, tracer, predictor=predictor, memory=memory)
    if keep and model_dir is not None:
        steps.resident_experts = {i: resident_stacks(model_dir, manifest, i) for i in keep}
    if opts.record_routing:
        steps.recording = {}
    sync_every = opts.sync_every or SYNC_EVERY
    if opts.mode == "route" and sync_every > 1:
        steps.groups = SyncGroups(sync_every, steps)
    if opts.mode == "route" and opts.route_policy != "predicted":
        deadline = DEFAULT_DEADLINE_MS if opts.route_deadline_ms is None else opts.route_deadline_ms
        steps.use_policy(RoutePolicy(opts.route_policy, deadline, steps, layer_heads))
    streams = make_streams(layers, steps, memory, manifest, opts.run_mode, opts.overlap)
    if predictor is not None:  # heads only for layers that are streamed
        predictor.targets = {a: b for a, b in predictor.targets.items() if b in streamed}
        for owner, target in predictor.targets.items():
            streams[owner].head = Lookahead(owner, predictor, streams[target], steps)
    width = prefetch_width(opts, k, manifest.n_experts, n_slots, len(streamed))
    if width is not None:
        steps.width = width
        for stream in streams.values():
            stream.width = width
            if stream.head is not None:
                stream.head.width = width
    install_streams(model, blocks, family, steps, streams)
    return steps, memory, table


def slot_dtypes(model: nn.Module, manifest: Manifest) -> dict[str, mx.Dtype]:
    """The dtypes the slot pool holds the record's fields in: resident stacks' rule (bf16/fp16
    scales kept where the native expert FFN reads them, else a float32 sidecar), decided on
    `model`'s expert stacks before its sparse blocks are replaced."""
    from edge0.layout.load import stack_dtypes

    return stack_dtypes(model, manifest, activation_dtype())


def choose_predictor(
    model: nn.Module, layers: list[int], opts: EngineOptions, model_dir: Path | None
) -> Predictor | None:
    """hint/route: the asked-for predictor, else trained heads when the model has them, else
    init; built over every MoE layer `layers` before the sparse blocks are replaced."""
    if opts.mode not in ("hint", "route"):
        return None
    name = opts.predictor or (
        "heads" if model_dir is not None and PrerouterSet.exists(model_dir) else "init"
    )
    pred = make_predictor(
        name, model, layers, model_dir, wrap=opts.first_layer == "wrap", recording=opts.recording
    )
    heads = getattr(getattr(pred, "heads", None), "heads", None)
    for head in (heads or {}).values():  # their float linears as native nodes (kernels.md)
        use_native(head)
    return pred


def prefetch_width(
    opts: EngineOptions, k: int, n_experts: int, n_slots: int, streamed: int
) -> Width | None:
    """hint's prefetch width (None: K, unordered, as route and batched steps prefetch).
    route's prediction is its routing: it reads K, and refuses another width."""
    w = opts.prefetch_width
    if opts.mode == "route" and w not in ("auto", k):
        raise ConfigError(
            f"--prefetch-width {w}: route mode runs the experts it prefetches, so it reads "
            f"its K={k}; use --mode hint for another width, or leave it auto"
        )
    if opts.mode != "hint" or opts.max_batch > 1:
        return None
    fixed = None if w == "auto" else int(w)
    return Width(k, n_experts, fixed, room(n_slots, k, streamed))


def kept_layers(layers: list[int], opts: EngineOptions, more: int = 0) -> list[int]:
    """The MoE layers whose experts stay resident (not streamed) outside resident mode: the
    first (--first-layer resident), then the `more` that follow it (the memory plan's)."""
    first = 1 if opts.first_layer == "resident" and len(layers) > 1 else 0
    return layers[: first + more]


def make_streams(
    layers: list[int],
    steps: Steps,
    memory: SlotMemory | None,
    manifest: Manifest,
    mode: str,
    overlap: bool = False,
) -> dict[int, LayerStream]:
    """One stream per MoE layer: over its resident experts when kept, else over its slots;
    `overlap`: its staged experts computed while the missing ones are read (hint, reactive)."""
    stream_cls = RoutedStream if mode == "route" else LayerStream
    streams: dict[int, LayerStream] = {}
    for i in layers:
        where: ResidentExperts | SlotExperts
        if i in steps.resident_experts:
            where = ResidentExperts(steps.resident_experts[i])
        else:
            assert memory is not None, f"MoE layer {i} is streamed but there is no slot pool"
            where = SlotExperts(i, memory.views[i], steps)
        streams[i] = stream_cls(i, steps, where, manifest.quantization)
        streams[i].overlap = overlap
    return streams


def install_streams(
    model: nn.Module, blocks: list[Any], family: Any, steps: Steps, streams: dict[int, LayerStream]
) -> None:
    """Replace each sparse block of `model` by its streaming block."""
    steps.layers = dict(streams)
    for i, attr, block in blocks:
        setattr(model.layers[i], attr, StreamingMoE(block, i, family, streams[i]))


def resident_stacks(model_dir: Path, manifest: Manifest, layer: int) -> dict[str, mx.array]:
    """All experts of `layer` as stacked (E, ...) arrays (CRC-checked), for a resident layer:
    narrow scales and biases kept where the native expert FFN reads them, else widened once
    (gather_qmm would widen every expert's per call): `edge0.layout.load.expert_dtypes`."""
    from edge0.layout.load import expert_dtypes, read_expert_stacks

    dtypes = expert_dtypes(model_dir, manifest, activation_dtype())
    stacks = read_expert_stacks(model_dir, manifest, layer)
    for name, a in stacks.items():
        if a.dtype != dtypes[name]:
            stacks[name] = a.astype(dtypes[name])
            mx.eval(stacks[name])  # one field's narrow copy alive at a time (memory.load_bytes)
            del a
    mx.eval(list(stacks.values()))
    return stacks
