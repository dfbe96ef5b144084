"""`edge0 run` on an edge0-layout directory: the streaming engine and Ctrl-C handling."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click

from edge0.cli.options import (  # noqa: F401 - MODES, runtime_options re-exported
    MODES,
    policy_kwargs,
    prefill_kwargs,
    runtime_options,
)


def is_layout(path: Path) -> bool:
    from edge0.layout.manifest import MANIFEST_FILE

    return (Path(path) / MANIFEST_FILE).is_file()


def run_streaming(
    path: Path,
    text: str,
    chat: bool,
    sampling: dict[str, Any],
    runtime: dict[str, Any],
    full: bool = False,
) -> None:
    """Stream the reply to stdout, the stats to stderr (one line, or with `full` the whole
    summary); Ctrl-C stops with the stats so far."""
    from edge0 import log
    from edge0.loop import run
    from edge0.model.generate import SamplingSettings
    from edge0.runtime.engine.api import Engine
    from edge0.runtime.engine.summary import RunStats

    json_file = runtime.pop("run_log_json", None)
    if json_file is not None:
        log.configure(json_file=json_file)
    predictor = runtime.pop("predictor")  # None: heads when trained ones exist, else init
    max_tokens = sampling.pop("max_tokens")
    settings = SamplingSettings(max_tokens=max_tokens, **sampling)
    holder: dict[str, Any] = {}
    dist = runtime.pop("dist", None) or {}
    if dist:
        from edge0.dist.worker import worker_from_cli

        if worker_from_cli(path, runtime, predictor, dist):  # a rank > 0 under mlx.launch
            return

    async def main() -> None:
        async with Engine.open(
            path,
            tiers=runtime["tiers"],
            mode=runtime["mode"] or "route",
            top_k=runtime["route_top_k"],
            predictor=predictor,
            first_layer=runtime["first_layer"],
            memory_budget=runtime["memory_budget"],
            trace=runtime["trace_file"],
            io_workers=runtime["io_workers"],
            adapter=runtime["adapter"],
            sync_every=runtime["sync_every"],
            context=runtime["context"],
            **prefill_kwargs(runtime),
            **policy_kwargs(runtime),
            **dist,
        ) as eng:
            holder["engine"] = eng
            if eng.setup.memory_plan is not None:
                click.echo(eng.setup.memory_plan.line(), err=True)
            last = ""
            async for piece in eng.generate(
                text, max_tokens=max_tokens, sampling=settings, chat=chat
            ):
                if isinstance(piece, RunStats):
                    if not last.endswith("\n"):
                        click.echo("")
                    sys.stdout.flush()  # the text ends before the summary on a shared terminal
                    click.echo(piece.summary() if full else piece.line(), err=True)
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
            stats = eng.last_stats
            click.echo(stats.summary() if full else stats.line(), err=True)
        sys.exit(130)
