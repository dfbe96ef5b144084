"""`edge0 bench kernels`: native kernels against MLX's ops in GB/s (edge0.bench.kernels)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edge0.cli.bench_batch import _ints
from edge0.errors import ConfigError


def _list(text: str, allowed: tuple[str, ...] | None, what: str) -> list[str]:
    got = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in got if allowed is not None and x not in allowed]
    if not got or bad:
        choices = f" (choose from {', '.join(allowed)})" if allowed else ""
        raise ConfigError(f"{what}: {text!r} is not a comma-separated list{choices}")
    return got


@click.command(name="kernels")
@click.option(
    "--shapes",
    default="demo,medium,35b,gpt-oss-20b",
    show_default=True,
    help="Model shapes whose matrices are measured, comma-separated.",
)
@click.option(
    "--rows",
    default="1,4",
    show_default=True,
    help="Token rows per call (M: 1 = decode, more = a batch), comma-separated.",
)
@click.option(
    "--threads",
    default="1,2",
    show_default=True,
    help="Native kernel threads to compare, comma-separated.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Interleaved rounds (medians are reported).",
)
@click.option(
    "--footprint",
    "footprint_mib",
    type=click.IntRange(8),
    default=96,
    show_default=True,
    help="MiB of weights per measurement (larger than the caches).",
)
@click.option(
    "--int8",
    is_flag=True,
    help="Also measure the opt-in int8-activation path "
    "(EDGE0_INT8_ACTIVATIONS) on one thread, and its error against float32.",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the result as JSON here.",
)
def command(
    shapes: str,
    rows: str,
    threads: str,
    rounds: int,
    footprint_mib: int,
    int8: bool,
    json_out: Path | None,
) -> None:
    """GB/s of quantized weights read by the native kernels and by MLX's own ops, per
    matrix of each shape, with the machine's memory bandwidth (docs/benchmarks/kernels.md)."""
    from edge0.bench.kernels import SHAPES, markdown, run_bench

    shape_list = _list(shapes, tuple(SHAPES), "--shapes")
    row_list, thread_list = _ints(rows, "--rows"), _ints(threads, "--threads")

    def progress(r: dict[str, Any]) -> None:
        parts = ", ".join(f"{k} {v['gbs']:.2f}" for k, v in r.items() if isinstance(v, dict))
        click.echo(f"{r['shape']} {r['kernel']} M={r['m']}: {parts} GB/s", err=True)

    try:
        result = run_bench(shape_list, row_list, rounds, thread_list, footprint_mib, progress, int8)
    except RuntimeError as exc:
        raise ConfigError(str(exc)) from exc
    click.echo(markdown(result))
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1))
