"""The click options shared by the commands that open an engine (`edge0 run`, `edge0 serve`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

# the decode modes (edge0.runtime.compute.runner.MODES; repeated here so `edge0 --help`
# does not import MLX)
MODES = ("resident", "reactive", "hint", "route")
# route policies (edge0.runtime.layers.policy.POLICIES, repeated for the same reason)
ROUTE_POLICIES = ("predicted", "available-first", "available-first-sync", "deadline")
# the parameter names `runtime_options` adds (commands pop them out of their keyword arguments)
RUNTIME_KEYS = (
    "tiers",
    "mode",
    "route_top_k",
    "predictor",
    "first_layer",
    "memory_budget",
    "context",
    "trace_file",
    "run_log_json",
    "io_workers",
    "adapter",
    "sync_every",
    "prefill_chunk",
    "route_policy",
    "route_deadline_ms",
)


def stats_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--stats line|full and -v (= --stats full): how much `edge0 run` reports on stderr."""
    fn = click.option("-v", "--verbose", is_flag=True, help="The same as --stats full.")(fn)
    return click.option(
        "--stats",
        type=click.Choice(["line", "full"]),
        default="line",
        show_default=True,
        help="Statistics on stderr after the text: one line (tok/s, memory, MiB read per "
        "token, blocked ms per step) or the full report (mode, compute, host syncs, "
        "overlap, prefill, hit rates, tickets, event-loop lag).",
    )(fn)


def sampling_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The sampler options shared by commands that generate."""
    options = [
        click.option(
            "--max-tokens",
            default=128,
            show_default=True,
            type=click.IntRange(1),
            help="Most tokens to generate.",
        ),
        click.option(
            "--temp",
            default=0.0,
            show_default=True,
            type=click.FloatRange(0.0),
            help="Sampling temperature; 0 is greedy.",
        ),
        click.option(
            "--top-p",
            default=1.0,
            show_default=True,
            type=click.FloatRange(0.0, 1.0),
            help="Nucleus sampling mass; 1.0 is off.",
        ),
        click.option(
            "--sample-top-k",
            "top_k",
            default=0,
            show_default=True,
            type=click.IntRange(0),
            help="Sample among the k most likely tokens; 0 is off.",
        ),
        click.option(
            "--min-p",
            default=0.0,
            show_default=True,
            type=click.FloatRange(0.0, 1.0),
            help="Drop tokens below min-p times the top probability; 0 is off.",
        ),
        click.option("--seed", default=None, type=int, help="Random seed for sampling."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def runtime_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The streaming-runtime options of `edge0 run` and `edge0 serve`."""
    options = [
        click.option(
            "--tiers",
            default="ram>pread",
            show_default=True,
            help="Tier stack, outermost first, e.g. "
            "'ram:1GiB>throttle:bw=400MB/s>direct'. A `ram` stage without a "
            "size holds 1 GiB, or what --memory-budget plans; one with a size "
            "keeps it (counted in the plan, refused if it cannot fit).",
        ),
        click.option(
            "--mode",
            type=click.Choice(MODES),
            default=None,
            help="Decode mode [default: route for edge0-layout dirs, else resident].",
        ),
        click.option(
            "--top-k",
            "route_top_k",
            type=click.IntRange(1),
            default=None,
            help="Routing capacity K: experts per token per layer [default: the "
            "model's top-k]. (The sampler's top-k is --sample-top-k.)",
        ),
        click.option(
            "--predictor",
            type=click.Choice(["init", "heads", "temporal"]),
            default=None,
            help="Who predicts the next step's experts (hint/route) "
            "[default: heads when prerouter.safetensors exists, else init].",
        ),
        click.option(
            "--first-layer",
            type=click.Choice(["resident", "wrap", "reactive"]),
            default="resident",
            show_default=True,
            help="First MoE layer: experts "
            "kept in memory, predicted by the last layer's wrap-around head, or "
            "routed and read on demand.",
        ),
        click.option(
            "--memory-budget",
            default=None,
            help="Peak memory (RSS), e.g. 3GiB, planned before loading: what resident "
            "weights, slots, KV cache and working memory leave buys more slots "
            "or the RAM cache (docs/memory.md).",
        ),
        click.option(
            "--context",
            type=click.IntRange(1),
            default=4096,
            show_default=True,
            help="Tokens of context (prompt + output) --memory-budget plans the KV "
            "cache for; longer requests are cut there.",
        ),
        click.option(
            "--trace",
            "trace_file",
            type=click.Path(dir_okay=False),
            default=None,
            help="Write a Chrome/Perfetto trace (compute + tier worker tracks).",
        ),
        click.option(
            "--log-json",
            "run_log_json",
            type=click.Path(dir_okay=False),
            default=None,
            help="Keep every structlog event (reads, compute spans) as JSON lines in this file.",
        ),
        click.option(
            "--io-workers",
            type=click.IntRange(1),
            default=2,
            show_default=True,
            help="Concurrent tier reads.",
        ),
        click.option(
            "--sync-every",
            type=click.IntRange(1),
            default=None,
            help="Route mode: evaluate the layers' predictions every G layers "
            "(host syncs per token ~ layers/G) [default: 4].",
        ),
        click.option(
            "--prefill-chunk",
            type=click.IntRange(1),
            default=None,
            help="Prompt tokens per forward; each streamed layer reads its chunk's "
            "experts once; 1 feeds the prompt one token per step [default: 256; under "
            "--memory-budget the largest up to 256 the plan can hold].",
        ),
        click.option(
            "--route-policy",
            type=click.Choice(ROUTE_POLICIES),
            default=None,
            help="Route mode: the experts a layer runs: the set predicted one token "
            "ahead, the best true experts in the slots, chosen in the graph "
            "(available-first), the best servable from slots or RAM, chosen on the "
            "host (available-first-sync), or that plus a same-token head fetching "
            "the next layer's experts one layer ahead (deadline) [default: "
            "predicted; docs/benchmarks/route_policy.md].",
        ),
        click.option(
            "--route-deadline-ms",
            type=click.FloatRange(0.0),
            default=None,
            help="available-first/deadline: the longest compute waits per layer for "
            "a true expert that is not servable; inf waits for all (exact routing) "
            "[default: 0].",
        ),
        click.option(
            "--adapter/--no-adapter",
            default=True,
            show_default=True,
            help="Apply the recovery LoRA in MODEL/adapters/ when it exists.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


SERVE_MAX_BATCH = 4  # `edge0 serve`: requests decoded together (docs/benchmarks/batch.md)


def max_batch_option(default: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--max-batch: up to this many requests decode together, one token each per step."""
    return click.option(
        "--max-batch",
        type=click.IntRange(1),
        default=default,
        show_default=True,
        help="Requests decoded together, one token each per step; each streamed layer reads "
        "the union of their experts once (the slot pool grows with it; 1: one request "
        "at a time, in arrival order).",
    )


def engine_kwargs(runtime: dict[str, Any]) -> dict[str, Any]:
    """`Engine.open` keyword arguments from the values of `runtime_options`."""
    return dict(
        tiers=runtime["tiers"],
        mode=runtime["mode"] or "route",
        top_k=runtime["route_top_k"],
        predictor=runtime["predictor"],
        first_layer=runtime["first_layer"],
        memory_budget=runtime["memory_budget"],
        trace=runtime["trace_file"],
        io_workers=runtime["io_workers"],
        adapter=runtime["adapter"],
        context=runtime["context"],
        sync_every=runtime["sync_every"],
        **prefill_kwargs(runtime),
        **policy_kwargs(runtime),
    )


def policy_kwargs(runtime: dict[str, Any]) -> dict[str, Any]:
    """`route_policy` / `route_deadline_ms` when given (else the engine's defaults apply)."""
    names = ("route_policy", "route_deadline_ms")
    return {n: runtime[n] for n in names if runtime.get(n) is not None}


def prefill_kwargs(runtime: dict[str, Any]) -> dict[str, Any]:
    """`prefill_chunk` when --prefill-chunk was given (else the engine's default applies)."""
    chunk = runtime.get("prefill_chunk")
    return {} if chunk is None else {"prefill_chunk": chunk}


class Renamed(click.Option):
    """An option whose later names are old spellings: still accepted, left out of --help."""

    def __init__(self, *args: Any, old: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.old = old

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        names = self.opts
        self.opts = [n for n in names if n not in self.old]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = names


def renamed(name: str, *old: str, dest: str, **kw: Any) -> Callable[[Any], Any]:
    """click.option(`name`, with `old` spellings kept as hidden aliases for a release)."""
    return click.option(name, *old, dest, cls=Renamed, old=old, **kw)
