"""CLI argument checks made before any work: output files, stdin text, flag combinations."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from edge0.errors import ConfigError, PromptError

# `edge0 run` flags that only the streaming engine reads (the resident loop would ignore them)
STREAMING_ONLY = {"tiers": "--tiers", "route_top_k": "--top-k", "predictor": "--predictor",
                  "first_layer": "--first-layer", "memory_budget": "--memory-budget",
                  "trace_file": "--trace", "io_workers": "--io-workers",
                  "route_policy": "--route-policy",
                  "route_deadline_ms": "--route-deadline-ms"}  # fmt: skip


def output_file(path: str | None, flag: str) -> None:
    """Refuse an output file whose directory is missing or not writable (checked up front)."""
    if path is None or path == "-":
        return
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{flag} {path}: directory {parent} is not writable")
    if Path(path).is_dir():
        raise ConfigError(f"{flag} {path} is a directory; give a file name")


def read_stdin_text() -> str:
    """All of stdin as UTF-8 text; invalid bytes are a PromptError naming the offset."""
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptError(
            f"stdin is not valid UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 4]!r}); "
            "pipe UTF-8 text, e.g. through `iconv -t utf-8`"
        ) from None


def streaming_only_flags(ctx: click.Context, why: str) -> None:
    """Refuse streaming-engine flags that were given when the resident loop will run."""
    default = (None, click.core.ParameterSource.DEFAULT)
    given = [f for k, f in STREAMING_ONLY.items() if ctx.get_parameter_source(k) not in default]
    if given:
        raise ConfigError(
            f"{', '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} to the streaming "
            f"engine, and {why}; drop "
            f"{'them' if len(given) > 1 else 'it'} or use a streaming --mode on an "
            "edge0-layout directory"
        )
