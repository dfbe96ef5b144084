"""`edge0 run` on an edge0-layout directory: the streaming engine, its options, Ctrl-C handling."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

# the decode modes (edge0.runtime.runner.MODES; repeated here so `edge0 --help` does not import MLX)
MODES = ("resident", "reactive", "hint", "route")


def runtime_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The streaming-runtime options of `edge0 run`."""
    options = [
        click.option("--tiers", default="ram:1GiB>pread", show_default=True,
                     help="Tier stack, outermost first, e.g. "
                          "'ram:1GiB>throttle:bw=400MB/s>direct'."),
        click.option("--mode", type=click.Choice(MODES), default=None,
                     help="Decode mode [default: route for edge0-layout dirs, else resident]."),
        click.option("--top-k", "route_top_k", type=click.IntRange(1), default=None,
                     help="Routing capacity K: experts per token per layer [default: the "
                          "model's top-k]. (The sampler's top-k is --sample-top-k.)"),
        click.option("--predictor", type=click.Choice(["init", "heads", "temporal"]),
                     default=None, help="Who predicts the next step's experts (hint/route) "
                     "[default: heads when prerouter.safetensors exists, else init]."),
        click.option("--first-layer", type=click.Choice(["resident", "wrap", "reactive"]),
                     default="resident", show_default=True, help="First MoE layer: experts "
                     "kept in memory, predicted by the last layer's wrap-around head, or "
                     "routed and read on demand."),
        click.option("--memory-budget", default=None,
                     help="Total memory, e.g. 3GiB: the RAM cache gets what resident weights, "
                          "slot tables and KV cache leave."),
        click.option("--trace", "trace_file", type=click.Path(dir_okay=False), default=None,
                     help="Write a Chrome/Perfetto trace (compute + tier worker tracks)."),
        click.option("--log-json", "run_log_json", type=click.Path(dir_okay=False),
                     default=None, help="Keep every structlog event (reads, compute spans) "
                     "as JSON lines in this file."),
        click.option("--io-workers", type=click.IntRange(1), default=2, show_default=True,
                     help="Concurrent tier reads."),
        click.option("--prefill-chunk", type=click.IntRange(1), default=None,
                     help="Prompt tokens per forward; each streamed layer reads its chunk's "
                     "experts once; 1 feeds the prompt one token per step [default: 256]."),
        click.option("--adapter/--no-adapter", default=True, show_default=True,
                     help="Apply the recovery LoRA in MODEL/adapters/ when it exists."),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn


def _chunk(runtime: dict[str, Any]) -> dict[str, int]:
    chunk = runtime.get("prefill_chunk")
    return {} if chunk is None else {"prefill_chunk": chunk}


def is_layout(path: Path) -> bool:
    from edge0.layout.manifest import MANIFEST_FILE

    return (Path(path) / MANIFEST_FILE).is_file()


def run_streaming(path: Path, text: str, chat: bool, sampling: dict[str, Any],
                  runtime: dict[str, Any]) -> None:  # fmt: skip
    """Stream the reply to stdout, the summary to stderr; Ctrl-C stops with the stats so far."""
    from edge0 import log
    from edge0.model.generate import SamplingSettings
    from edge0.runtime.engine import Engine, run
    from edge0.runtime.summary import RunStats

    json_file = runtime.pop("run_log_json", None)
    if json_file is not None:
        log.configure(json_file=json_file)
    predictor = runtime.pop("predictor")  # None: heads when trained ones exist, else init
    max_tokens = sampling.pop("max_tokens")
    settings = SamplingSettings(max_tokens=max_tokens, **sampling)
    holder: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(
            path, tiers=runtime["tiers"], mode=runtime["mode"] or "route",
            top_k=runtime["route_top_k"], predictor=predictor,
            first_layer=runtime["first_layer"], memory_budget=runtime["memory_budget"],
            trace=runtime["trace_file"], io_workers=runtime["io_workers"],
            adapter=runtime["adapter"], **_chunk(runtime),
        ) as eng:  # fmt: skip
            holder["engine"] = eng
            if eng.setup.memory_plan is not None:
                click.echo(eng.setup.memory_plan.line(), err=True)
            last = ""
            async for piece in eng.generate(text, max_tokens=max_tokens, sampling=settings,
                                            chat=chat):  # fmt: skip
                if isinstance(piece, RunStats):
                    if not last.endswith("\n"):
                        click.echo("")
                    sys.stdout.flush()  # the text ends before the summary on a shared terminal
                    click.echo(piece.summary(), err=True)
                else:
                    click.echo(piece, nl=False)
                    sys.stdout.flush()
                    last = piece

    try:
        run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        eng = holder.get("engine")
        click.echo("", err=False)
        click.echo("edge0: interrupted", err=True)
        if eng is not None and eng.last_stats is not None:
            click.echo(eng.last_stats.summary(), err=True)
        sys.exit(130)
