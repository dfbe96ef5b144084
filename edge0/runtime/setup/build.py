"""Building an engine: plan the memory (edge0.runtime.plan), load the model, make it stream
(`prepare`, on the compute thread), open the tier stack and the scheduler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.nn as nn

from edge0.heap import fix_mmap_threshold
from edge0.kernels import native
from edge0.layout import pagecache
from edge0.layout.manifest import RESIDENT_FILE, Manifest
from edge0.log import get_logger
from edge0.options.engine import EngineOptions
from edge0.routing.prerouter_config import FILES as PREROUTER_FILES
from edge0.runtime.compute.runner import Runner
from edge0.runtime.compute.steps import Steps
from edge0.runtime.compute.thread import ComputeThread
from edge0.runtime.io.scheduler import Scheduler, build_scheduler
from edge0.runtime.io.source import ReadView
from edge0.runtime.io.trace import Tracer
from edge0.runtime.plan.chunk import DEFAULT_CHUNK
from edge0.runtime.plan.footprint import footprint
from edge0.runtime.plan.memory import MemoryPlan, given_cache, plan, with_ram
from edge0.runtime.setup.prepare import prepare
from edge0.stats import current_rss_bytes
from edge0.storage.spec import open_tiers
from edge0.storage.tier import Tier

__all__ = ["Setup", "build"]

log = get_logger("edge0.runtime.engine.api")


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
    # edge0.ranks replaces how a request runs (rank 0 of a pipeline) and adds its own shutdown
    runner: Callable[..., Any] | None = None  # (request, sampler, settings) -> a Runner
    on_close: list[Callable[[], Awaitable[None]]] = attrs.Factory(list)
    dist: Any = None  # the pipeline node (edge0.ranks.build.Node) of rank 0
    exactness: str = "exact"  # what the stats line says of the output (routing.validation)

    @property
    def reads(self) -> ReadView | None:
        """The scheduler's counters and pool, read only (None: nothing is streamed)."""
        return self.scheduler

    def make_runner(self, request: int, sampler: Any, settings: Any) -> Any:
        if self.runner is not None:
            return self.runner(request, sampler, settings)
        return Runner(self.model, self.ctx, request, sampler)


def drop_read_once(path: Path) -> list[str]:
    """Drop the page cache of the files that load read whole and never reads again (the
    resident weights, the heads): under a memory budget their pages would only crowd what
    the run reads, and a memory cgroup counts them (docs/runtime.md, "Memory budget").
    Returns the files' names."""
    names = [RESIDENT_FILE] + [weights for weights, _ in PREROUTER_FILES.values()]
    dropped = [n for n in names if (path / n).is_file()]
    for name in dropped:
        pagecache.drop(path / name)
    log.info("page_cache_dropped", files=dropped)
    return dropped


async def build(path: Path, opts: EngineOptions, compute: ComputeThread) -> Setup:
    """Load `path` on the compute thread, then open the tier stack and the scheduler."""
    from edge0.layout.load import load_layout
    from edge0.model.loader import LoadedModel

    opts.check()
    fix_mmap_threshold()  # before any weights: large blocks stay out of glibc's arenas
    # the kernels' unit and thread counts, timed (or read from the cache) on the compute thread
    # before the plan asks which stacks they read and before any reader runs (kernels.md)
    await compute.run(native.module)
    baseline = current_rss_bytes()  # interpreter + libraries, before any weights
    manifest = Manifest.load(path)
    spec = opts.tiers
    memory_plan = None
    if opts.memory_budget is not None:  # from the headers: refuses before anything is loaded
        given = given_cache(spec) if isinstance(spec, str) else None  # ram:SIZE is kept
        memory_plan = plan(
            opts.memory_budget, footprint(path, manifest, opts, baseline), opts.prefill_chunk, given
        )
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
    more = memory_plan.resident_layers if memory_plan is not None else 0
    ctx, memory, table = await compute.run(
        lambda: prepare(loaded.model, manifest, opts, path, tracer, n_slots, more)
    )
    ctx.prefill_chunk = (
        memory_plan.prefill_chunk
        if memory_plan is not None
        else opts.prefill_chunk or DEFAULT_CHUNK
    )
    if memory_plan is not None:
        await compute.run(lambda: drop_read_once(path))
    setup = Setup(opts, path, loaded.model, loaded.tokenizer, manifest, ctx, tracer)
    setup.memory_plan = memory_plan
    if memory is None or table is None:
        return setup
    setup.tier = open_tiers(spec, path, manifest)
    layers = list(table.order)
    if not layers:
        return setup  # nothing streamed (a single MoE layer kept resident)
    setup.scheduler = build_scheduler(setup.tier, memory, table, tracer, opts.io_workers)
    ctx.attach(setup.scheduler)
    return setup
