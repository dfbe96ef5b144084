"""Building an engine: load the resident model, predictor, streaming blocks, tier stack."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.errors import ConfigError
from edge0.layout.manifest import Manifest
from edge0.log import get_logger
from edge0.model.loaded import activation_dtype
from edge0.model.sparse import sparse_blocks
from edge0.routing.families import family_for
from edge0.routing.predictors import NAMES, Predictor, make_predictor
from edge0.routing.prerouter import PrerouterSet
from edge0.runtime.block import StreamingMoE
from edge0.runtime.layers import LayerStream, Lookahead, ResidentExperts, RoutedStream, SlotExperts
from edge0.runtime.memory import (
    DEFAULT_CHUNK,
    Footprint,
    MemoryPlan,
    head_bytes,
    kv_bytes,
    load_bytes,
    plan,
    state_bytes,
    with_ram,
    working_bytes,
)
from edge0.runtime.policy import (
    DEFAULT_DEADLINE_MS,
    DEFAULT_POLICY,
    RoutePolicy,
    check_policy,
    layer_heads_for,
)
from edge0.runtime.prefill_memory import chunk_bytes_per_token, chunk_fixed_bytes
from edge0.runtime.runner import Runner
from edge0.runtime.scheduler import ComputeThread, Scheduler
from edge0.runtime.slotmem import ALIGN, SlotMemory, slot_bytes
from edge0.runtime.slots import SlotPool, pool_size
from edge0.runtime.stats import current_rss_bytes
from edge0.runtime.steps import MODES, Steps
from edge0.runtime.syncs import SyncGroups
from edge0.runtime.trace import Tracer
from edge0.storage.spec import open_tiers
from edge0.storage.tier import Tier

log = get_logger("edge0.runtime.engine")
KV_CONTEXT = 4096  # tokens of KV cache the memory plan reserves by default
# first streamed layer: its experts resident in memory; predicted by the last layer's
# wrap-around head; or routed and read on demand (docs/runtime.md has the measurements)
FIRST_LAYER = ("resident", "wrap", "reactive")
SYNC_EVERY = 4  # route mode: layers per host sync (docs/benchmarks/runtime.md)


@attrs.frozen
class EngineOptions:
    """How an engine runs (the CLI flags of `edge0 run` map onto these)."""

    tiers: Any = "ram:1GiB>pread"  # a spec string or a Tier object
    mode: str = "route"
    top_k: int | None = None  # routing capacity K; None: the model's top-k
    predictor: str | None = None  # None: "heads" when prerouter.safetensors exists, else "init"
    memory_budget: str | int | None = None
    trace: str | Path | None = None  # Chrome trace JSON written at close
    first_layer: str = "resident"  # resident | wrap | reactive (FIRST_LAYER)
    io_workers: int = 2
    sync_every: int | None = None  # route: host syncs every G layers (None: SYNC_EVERY)
    recording: dict[tuple[int, int], list[int]] | None = None  # for the oracle predictor
    record_routing: bool = False  # keep true routing in steps.recording (to replay as oracle)
    adapter: bool = True  # apply MODEL/adapters/ (recovery LoRA) when present
    context: int = KV_CONTEXT  # tokens of context a memory budget plans for (prompt + output)
    # prompt tokens per forward; 1: one token per step; None: DEFAULT_CHUNK, or what the
    # memory plan chooses under a budget (an asked-for chunk must fit the plan)
    prefill_chunk: int | None = None
    # several ranks (edge0.dist): hosts "2", "ip,ip" or hosts.json; layers per rank "4,4"
    hosts: str | int | None = None
    layers: str | None = None
    rank_timeout: float = 120.0  # seconds a rank may take for one step before rank 0 gives up
    # requests decoded together, one token each per step (edge0.runtime.batcher); the slot
    # pool and the KV reserve of a memory plan grow with it
    max_batch: int = 1
    token_buffer: int = 64  # unread tokens of a batched request before it is paused
    # route mode: which experts a layer runs (edge0.runtime.policy); deadline None: the default
    route_policy: str = DEFAULT_POLICY
    route_deadline_ms: float | None = None

    def check(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.predictor is not None and self.predictor not in NAMES:
            raise ConfigError(
                f"unknown predictor {self.predictor!r}; choose one of {', '.join(NAMES)}"
            )
        if self.first_layer not in FIRST_LAYER:
            raise ConfigError(
                f"first_layer must be one of {', '.join(FIRST_LAYER)}, not {self.first_layer!r}"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k must be at least 1, got {self.top_k}")
        if self.sync_every is not None and self.sync_every < 1:
            raise ConfigError(f"--sync-every must be at least 1, got {self.sync_every}")
        if self.context < 1:
            raise ConfigError(f"context must be at least 1 token, got {self.context}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ConfigError(f"--prefill-chunk must be at least 1, got {self.prefill_chunk}")
        if self.max_batch < 1:
            raise ConfigError(f"--max-batch must be at least 1, got {self.max_batch}")
        if self.token_buffer < 1:
            raise ConfigError(f"token_buffer must be at least 1, got {self.token_buffer}")
        if self.max_batch > 1 and self.hosts is not None:
            raise ConfigError("--max-batch > 1 is not supported with --hosts; use --max-batch 1")
        if self.io_workers < 1:
            raise ConfigError(f"io_workers must be at least 1, got {self.io_workers}")
        check_policy(self.route_policy, self.route_deadline_ms)
        if self.route_policy != "predicted" and (
            self.mode != "route" or self.hosts is not None or self.max_batch > 1
        ):
            raise ConfigError(
                f"--route-policy {self.route_policy} needs --mode route on one process, one "
                f"request per step (got mode {self.mode}"
                f"{', --hosts' if self.hosts is not None else ''}"
                f"{', --max-batch ' + str(self.max_batch) if self.max_batch > 1 else ''})"
            )


@attrs.define
class Setup:
    """Everything an Engine runs with."""

    options: EngineOptions
    path: Path
    model: nn.Module
    tokenizer: Any
    manifest: Manifest
    ctx: Steps  # the step clock and per-layer streams of the model
    tracer: Tracer
    scheduler: Scheduler | None = None
    tier: Tier | None = None
    memory_plan: MemoryPlan | None = None
    # edge0.dist replaces how a request runs (rank 0 of a pipeline) and adds its own shutdown
    runner: Callable[..., Any] | None = None  # (request, sampler, settings) -> a Runner
    on_close: list[Callable[[], Awaitable[None]]] = attrs.Factory(list)
    dist: Any = None  # the pipeline node (edge0.dist.build.Node) of rank 0

    def make_runner(self, request: int, sampler: Any, settings: Any) -> Any:
        if self.runner is not None:
            return self.runner(request, sampler, settings)
        return Runner(self.model, self.ctx, request, sampler)


def batch_k(top_k: int, max_batch: int, n_experts: int) -> int:
    """Experts a layer may need in one step: the union of `max_batch` rows' sets."""
    return min(n_experts, top_k * max_batch)


def model_top_k(block: nn.Module) -> int:
    for owner in (block, *(block[a] for a in ("router", "gate") if a in block)):  # granitemoe
        for attr in ("top_k", "num_experts_per_tok"):
            k = getattr(owner, attr, None)
            if isinstance(k, int):
                return k
    raise ConfigError(f"cannot tell the top-k of sparse block {type(block).__name__}")


def prepare(
    model: nn.Module, manifest: Manifest, opts: EngineOptions, model_dir: Path | None,
    tracer: Tracer, n_slots: int | None = None,
) -> tuple[Steps, SlotMemory | None, SlotPool | None]:  # fmt: skip
    """On the compute thread: predictor, slot memory, one stream per layer, streaming blocks.

    The mode is decided here, once: which stream class each layer gets, which
    layers own a prediction, where each layer's experts are.
    """
    blocks = sparse_blocks(model)
    layers = [i for i, _, _ in blocks]
    k = opts.top_k or model_top_k(blocks[0][2])
    if k > manifest.n_experts:
        raise ConfigError(f"--top-k {k} exceeds the {manifest.n_experts} experts per layer")
    family = family_for(manifest.model_type)
    if opts.mode == "resident":
        for _, _, block in blocks:
            family.set_top_k(block, k)  # the block's and its router's (DeepSeek's gate)
        return Steps("resident", k, tracer), None, None
    predictor = choose_predictor(model, layers, opts, model_dir)
    layer_heads = (
        layer_heads_for(model_dir, model) if opts.route_policy == "deadline" else None
    )  # fmt: skip  # read from the routers before the blocks are replaced
    keep = kept_layers(layers, opts)
    streamed = [i for i in layers if i not in keep]
    n_slots = n_slots or pool_size(batch_k(k, opts.max_batch, manifest.n_experts), len(streamed))
    memory = SlotMemory(manifest, streamed, n_slots, activation_dtype())
    table = SlotPool(streamed, n_slots)
    steps = Steps(opts.mode, k, tracer, predictor=predictor, memory=memory)
    if keep and model_dir is not None:
        steps.resident_experts = {i: resident_stacks(model_dir, manifest, i) for i in keep}
    if opts.record_routing:
        steps.recording = {}
    sync_every = opts.sync_every or SYNC_EVERY
    if opts.mode == "route" and sync_every > 1:
        steps.groups = SyncGroups(sync_every, steps)
    if opts.mode == "route" and opts.route_policy != "predicted":
        deadline = DEFAULT_DEADLINE_MS if opts.route_deadline_ms is None else opts.route_deadline_ms
        steps.policy = RoutePolicy(opts.route_policy, deadline, steps, layer_heads)
    streams = make_streams(layers, steps, memory, manifest, opts.mode)
    if predictor is not None:  # heads only for layers that are streamed
        predictor.targets = {a: b for a, b in predictor.targets.items() if b in streamed}
        for owner, target in predictor.targets.items():
            streams[owner].head = Lookahead(owner, predictor, streams[target], steps)
    install_streams(model, blocks, family, steps, streams)
    return steps, memory, table


def choose_predictor(model: nn.Module, layers: list[int], opts: EngineOptions,
                     model_dir: Path | None) -> Predictor | None:  # fmt: skip
    """hint/route: the asked-for predictor, else trained heads when the model has them, else
    init; built over every MoE layer `layers` before the sparse blocks are replaced."""
    if opts.mode not in ("hint", "route"):
        return None
    name = opts.predictor or (
        "heads" if model_dir is not None and PrerouterSet.exists(model_dir) else "init"
    )
    return make_predictor(name, model, layers, model_dir, wrap=opts.first_layer == "wrap",
                          recording=opts.recording)  # fmt: skip


def kept_layers(layers: list[int], opts: EngineOptions) -> list[int]:
    """The MoE layers whose experts stay resident (not streamed) outside resident mode."""
    return layers[:1] if opts.first_layer == "resident" and len(layers) > 1 else []


def make_streams(layers: list[int], steps: Steps, memory: SlotMemory, manifest: Manifest,
                 mode: str) -> dict[int, LayerStream]:  # fmt: skip
    """One stream per MoE layer: over its resident experts when kept, else over its slots."""
    stream_cls = RoutedStream if mode == "route" else LayerStream
    streams: dict[int, LayerStream] = {}
    for i in layers:
        where: ResidentExperts | SlotExperts = (
            ResidentExperts(steps.resident_experts[i]) if i in steps.resident_experts
            else SlotExperts(i, memory.views[i], steps)
        )  # fmt: skip
        streams[i] = stream_cls(i, steps, where, manifest.quantization)
    return streams


def install_streams(model: nn.Module, blocks: list[Any], family: Any, steps: Steps,
                    streams: dict[int, LayerStream]) -> None:  # fmt: skip
    """Replace each sparse block of `model` by its streaming block."""
    steps.layers = dict(streams)
    for i, attr, block in blocks:
        setattr(model.layers[i], attr, StreamingMoE(block, i, family, streams[i]))


async def build(path: Path, opts: EngineOptions, compute: ComputeThread) -> Setup:
    """Load `path` on the compute thread, then open the tier stack and the scheduler."""
    from edge0.layout.load import load_layout
    from edge0.model.loader import LoadedModel

    opts.check()
    if opts.hosts is not None:
        from edge0.dist.launch import build_pipeline

        return await build_pipeline(path, opts, compute)
    baseline = current_rss_bytes()  # interpreter + libraries, before any weights
    manifest = Manifest.load(path)
    spec = opts.tiers
    memory_plan = None
    if opts.memory_budget is not None:  # from the headers: refuses before anything is loaded
        memory_plan = plan(opts.memory_budget, footprint(path, manifest, opts, baseline),
                           opts.prefill_chunk)  # fmt: skip
        if isinstance(spec, str):
            spec = with_ram(spec, memory_plan.cache)
        log.info("memory_plan", line=memory_plan.line(), tiers=spec)
    experts = "resident" if opts.mode == "resident" else "none"
    def load() -> LoadedModel:  # on the compute thread: MLX streams are thread-affine
        from edge0.model.lora import maybe_apply_adapters

        loaded = load_layout(path, experts=experts)
        maybe_apply_adapters(loaded.model, path, enabled=opts.adapter)
        return loaded

    loaded: LoadedModel = await compute.run(load)
    tracer = Tracer(chrome=opts.trace is not None)
    n_slots = memory_plan.n_slots if memory_plan is not None else None
    ctx, memory, table = await compute.run(
        lambda: prepare(loaded.model, manifest, opts, path, tracer, n_slots)
    )
    ctx.prefill_chunk = (memory_plan.prefill_chunk if memory_plan is not None
                         else opts.prefill_chunk or DEFAULT_CHUNK)  # fmt: skip
    setup = Setup(opts, path, loaded.model, loaded.tokenizer, manifest, ctx, tracer)
    setup.memory_plan = memory_plan
    if memory is None or table is None:
        return setup
    setup.tier = open_tiers(spec, path, manifest)
    layers = list(table.order)
    if not layers:
        return setup  # nothing streamed (a single MoE layer kept resident)
    setup.scheduler = Scheduler(setup.tier, memory, table, layers, tracer, opts.io_workers)
    ctx.attach(setup.scheduler)
    return setup


def footprint(path: Path, manifest: Manifest, opts: EngineOptions, baseline: int) -> Footprint:
    """What a run with `opts` will hold, from the files' headers (nothing is loaded)."""
    from edge0.layout.load import resident_bytes
    from edge0.layout.safetensors_io import MX_DTYPES

    text = manifest.config.get("text_config") or manifest.config
    dtype = activation_dtype(MX_DTYPES[manifest.float_dtype])
    k = opts.top_k or int(text["num_experts_per_tok"])
    moe = list(manifest.moe_layers)
    expert = sum(int(np.prod(f.shape)) * (4 if f.dtype == "uint32" else 1 if f.dtype == "uint8"
                 else dtype.size) for f in manifest.fields)  # fmt: skip  # one expert, floats cast
    resident = resident_bytes(path, manifest, dtype) + _adapter_bytes(path, opts)
    chunk = (chunk_fixed_bytes(manifest.config), chunk_bytes_per_token(manifest.config, k,
                                                                        opts.context))  # fmt: skip
    load = load_bytes(manifest, dtype.size)
    if opts.mode == "resident":
        return Footprint(resident, len(moe) * manifest.n_experts * expert, 0, 0, 0, 0, k,
                         opts.max_batch * kv_bytes(manifest.config, opts.context),
                         opts.max_batch * state_bytes(manifest.config),
                         working_bytes(manifest.config, opts.context), baseline,
                         *chunk, load)  # fmt: skip
    kept = 1 if opts.first_layer == "resident" and len(moe) > 1 else 0
    predictor = opts.predictor or ("heads" if PrerouterSet.exists(path) else "init")
    owners = len(moe) - 1 + int(opts.first_layer == "wrap")
    heads = head_bytes(path, manifest, predictor, owners) if opts.mode in ("hint", "route") else 0
    b = opts.max_batch  # the union of b rows' sets per layer; a KV cache and state per row
    return Footprint(
        resident, kept * manifest.n_experts * expert, heads,
        slot_bytes(manifest, 1, dtype) - ALIGN, manifest.record_size, len(moe) - kept,
        batch_k(k, b, manifest.n_experts),
        b * kv_bytes(manifest.config, opts.context), b * state_bytes(manifest.config),
        working_bytes(manifest.config, opts.context), baseline, *chunk, load if kept else 0,
    )  # fmt: skip


def _adapter_bytes(path: Path, opts: EngineOptions) -> int:
    from edge0.layout.safetensors_io import read_header
    from edge0.model.lora import ADAPTER_DIR, WEIGHTS_FILE

    file = path / ADAPTER_DIR / WEIGHTS_FILE
    if not opts.adapter or not file.is_file():
        return 0
    return sum(int(np.prod(v.shape, dtype=np.int64)) * v.itemsize
               for v in read_header(file).values())  # fmt: skip


def resident_stacks(model_dir: Path, manifest: Manifest, layer: int) -> dict[str, mx.array]:
    """All experts of `layer` as stacked (E, ...) arrays (CRC-checked), for a resident layer."""
    from edge0.layout.load import read_expert_stacks

    dtype = activation_dtype()
    stacks = read_expert_stacks(model_dir, manifest, layer)
    for name, a in stacks.items():  # gather_qmm would widen every expert's scales per call
        if mx.issubdtype(a.dtype, mx.floating) and a.dtype.size < dtype.size:
            stacks[name] = a.astype(dtype)
            mx.eval(stacks[name])  # one field's narrow copy alive at a time (memory.load_bytes)
            del a
    mx.eval(list(stacks.values()))
    return stacks
