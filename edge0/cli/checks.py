"""CLI argument checks made before any work: model paths, tier specs, sizes, output files, stdin.

They import neither MLX nor mlx-lm nor transformers, so a bad argument is refused
in well under a second (tests/test_cli_fast_errors.py).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import click

from edge0.errors import ConfigError, ModelLoadError, PromptError

# `edge0 run` flags that only the streaming engine reads (the resident loop would ignore them)
STREAMING_ONLY = {
    "tiers": "--tiers",
    "route_top_k": "--top-k",
    "predictor": "--predictor",
    "first_layer": "--first-layer",
    "memory_budget": "--memory-budget",
    "trace_file": "--trace",
    "io_workers": "--io-workers",
    "route_policy": "--route-policy",
    "route_deadline_ms": "--route-deadline-ms",
}


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


def model_dir(path: Path | None) -> None:
    """Refuse a MODEL argument that cannot be a model directory (None: the demo model)."""
    if path is None:
        return
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"{path}: no such model directory; check the path (a Hugging Face or mlx-lm "
            "checkpoint directory, or the output of `edge0 convert`)"
        )
    if not path.is_dir():
        raise ModelLoadError(f"{path}: is a file; pass the model directory that contains it")
    if not any((path / name).exists() for name in ("edge0.json", "config.json")):
        raise ModelLoadError(
            f"{path / 'config.json'}: not found; point Edge0 at a model directory with "
            "config.json and *.safetensors (a Hugging Face or mlx-lm checkpoint, or `edge0 "
            "convert` output)"
        )


def tier_spec(spec: str | None, flag: str = "--tiers") -> None:
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


def runtime_args(runtime: dict[str, object]) -> None:
    """The engine options of `edge0 run` / `edge0 serve` that click cannot check itself."""
    tiers = runtime.get("tiers")
    tier_spec(tiers if isinstance(tiers, str) else None)
    budget = runtime.get("memory_budget")
    size(budget if isinstance(budget, str) else None, "--memory-budget")
    for key, flag in (("trace_file", "--trace"), ("run_log_json", "--log-json")):
        value = runtime.get(key)
        output_file(value if isinstance(value, str) else None, flag)


SEED_MAX = 2**64 - 1  # the sampler's seed range (edge0.model.generate.SEED_MAX)


def sampling_args(sampling: dict[str, object]) -> None:
    """Refuse sampler values no sampler can use (NaN, inf, a seed out of range) up front, in
    the words of `SamplingSettings`, which checks them again."""

    def bad(name: str, value: object, want: str) -> ConfigError:
        return ConfigError(f"sampling {name}={value!r} is invalid: {want}")

    temp = sampling.get("temp")
    if isinstance(temp, float) and not (math.isfinite(temp) and temp >= 0):
        raise bad("temp", temp, "use a finite number >= 0 (0 is greedy)")
    for name in ("top_p", "min_p"):
        value = sampling.get(name)
        if isinstance(value, float) and not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise bad(name, value, "use a number in [0, 1]")
    seed = sampling.get("seed")
    if isinstance(seed, int) and not 0 <= seed <= SEED_MAX:
        raise bad("seed", seed, f"use an integer in [0, {SEED_MAX}]")
