"""`edge0 run` on an edge0-layout directory: the streaming engine and Ctrl-C handling."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click


def is_layout(path: Path) -> bool:
    from edge0.layout.manifest import MANIFEST_FILE

    return (Path(path) / MANIFEST_FILE).is_file()


def run_streaming(
    path: Path,
    text: str,
    chat: bool,
    settings: Any,
    engine: dict[str, Any],
    log_json: str | None = None,
    full: bool = False,
) -> None:
    """Stream the reply to stdout, the stats to stderr (one line, or with `full` the whole
    summary); Ctrl-C stops with the stats so far. `engine` holds `Engine.open`'s keywords."""
    from edge0 import log
    from edge0.loop import run
    from edge0.runtime.engine.api import Engine
    from edge0.runtime.engine.summary import RunStats

    if log_json is not None:
        log.configure(json_file=log_json)
    holder: dict[str, Any] = {}
    if "hosts" in engine:
        from edge0.ranks.worker import worker_from_cli

        if worker_from_cli(path, engine):  # a rank > 0 under mlx.launch
            return

    async def main() -> None:
        async with Engine.open(path, **engine) as eng:
            holder["engine"] = eng
            if eng.setup.memory_plan is not None:
                click.echo(eng.setup.memory_plan.line(), err=True)
            last = ""
            stream = eng.generate(
                text, max_tokens=settings.max_tokens, sampling=settings, chat=chat
            )
            async for piece in stream:
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
