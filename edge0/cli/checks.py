"""CLI argument checks made before any work: model paths, tier specs, sizes, output files, stdin.

They import neither MLX nor mlx-lm nor transformers, so a bad argument is refused
in well under a second (tests/test_cli_fast_errors.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from edge0.errors import ConfigError, ModelLoadError, PromptError
from edge0.hub.ids import HubId, parse
from edge0.options.declare import declared
from edge0.options.engine import EngineOptions

# what `edge0 run`'s resident loop reads of the engine options (the rest stream experts)
RESIDENT_READS = ("mode", "adapter", "hosts", "layers", "rank_timeout")


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
    given = [
        o.flag
        for a, o in declared(EngineOptions)
        if "run" in o.commands
        and a.name not in RESIDENT_READS
        and ctx.get_parameter_source(o.cli_name(a.name)) not in default
    ]
    if given:
        raise ConfigError(
            f"{', '.join(str(f) for f in given)} only appl{'y' if len(given) > 1 else 'ies'} "
            f"to the streaming engine, and {why}; drop "
            f"{'them' if len(given) > 1 else 'it'} or use a streaming --mode on an "
            "edge0-layout directory"
        )


def model_arg(model: str | None) -> HubId | None:
    """A MODEL argument: the hub id it names (checked later, by the Hub), or None after the
    checks of a local directory (None also for no MODEL: the demo model)."""
    if model is None:
        return None
    hub = parse(model)
    if hub is None:
        model_dir(Path(model))
    return hub


def model_dir(path: Path | None) -> None:
    """Refuse a MODEL argument that cannot be a model directory (None: the demo model)."""
    if path is None:
        return
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"{path}: no such model directory; check the path (a Hugging Face or mlx-lm "
            "checkpoint directory, the output of `edge0 convert`, or a hub id ORG/NAME)"
        )
    if not path.is_dir():
        raise ModelLoadError(f"{path}: is a file; pass the model directory that contains it")
    if not any((path / name).exists() for name in ("edge0.json", "config.json")):
        raise ModelLoadError(
            f"{path / 'config.json'}: not found; point Edge0 at a model directory with "
            "config.json and *.safetensors (a Hugging Face or mlx-lm checkpoint, or `edge0 "
            "convert` output)"
        )


def tier_spec(spec: str | None, flag: str) -> None:
    """Parse the tier spec and every stage's options now (opens no file)."""
    if spec is None:
        return
    from edge0.storage.spec import check_spec

    try:
        check_spec(spec)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {spec!r}: {exc}") from None


def size(value: str | None, flag: str) -> None:
    """Refuse a size that does not parse (e.g. `--memory-budget 3GB` is fine, `3 gigs` is not)."""
    if value is None:
        return
    from edge0.storage.spec import parse_size

    try:
        parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def runtime_args(engine: dict[str, object], log_json: str | None = None) -> None:
    """The engine options (Engine.open's keywords) that click cannot check itself: tier
    specs, sizes and output files, by the kind their declaration names."""
    checks: dict[str, Callable[[str | None, str], None]] = {
        "tiers": tier_spec,
        "size": size,
        "output-file": output_file,
    }
    for a, o in declared(EngineOptions):
        value = engine.get(a.name)
        if o.value is not None and isinstance(value, str):
            checks[o.value](value, str(o.flag))
    output_file(log_json, "--log-json")
