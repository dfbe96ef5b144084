"""`edge0 bench batch`: decode with 1, 2, 4, 8 requests together (edge0.bench.batch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edge0.cli.options import renamed
from edge0.errors import ConfigError


def _ints(text: str, what: str) -> list[int]:
    try:
        got = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        got = []
    if not got or min(got) < 1:
        raise ConfigError(f"{what} must be positive integers separated by commas, not {text!r}")
    return got


@click.command(name="batch")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--modes", default="route,reactive", show_default=True, help="Decode modes, comma-separated."
)
@click.option(
    "--batches",
    default="1,2,4,8",
    show_default=True,
    help="Requests decoded together (max_batch), comma-separated.",
)
@click.option(
    "--tiers",
    "stacks",
    multiple=True,
    metavar="SPEC",
    help="Tier stack (repeatable) [default: pread, over the page cache].",
)
@click.option(
    "--io-ratio",
    type=click.FloatRange(min=0.01),
    default=None,
    help="Also a throttle where batch 1's reads take this x its compute (a reactive "
    "batch-1 calibration run over the page cache sets it).",
)
@renamed(
    "--top-k",
    "--k",
    dest="k",
    type=click.IntRange(1),
    default=None,
    help="Routing capacity K [default: the model's top-k].",
)
@click.option(
    "--tokens",
    type=click.IntRange(2),
    default=16,
    show_default=True,
    help="Tokens generated per request.",
)
@click.option("--prompt-len", type=click.IntRange(1), default=8, show_default=True)
@click.option(
    "--repeats",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Interleaved rounds (medians are reported).",
)
@click.option(
    "--same-prompt",
    is_flag=True,
    help="Every request gets the same prompt (the most a batch can share); default: "
    "each its own random prompt.",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the result as JSON here.",
)
def command(
    model_dir: Path,
    modes: str,
    batches: str,
    stacks: tuple[str, ...],
    io_ratio: float | None,
    k: int | None,
    tokens: int,
    prompt_len: int,
    repeats: int,
    same_prompt: bool,
    json_out: Path | None,
) -> None:
    """Aggregate and per-request decode tok/s, MiB read per generated token and blocked
    ms/step with 1, 2, 4, 8 requests decoded together (docs/benchmarks/batch.md)."""
    from edge0.cli.checks import tier_spec

    for spec in stacks:
        tier_spec(spec, "--tiers")  # before any model is loaded
    from edge0.bench.batch import markdown, run_bench

    def progress(r: dict[str, Any]) -> None:
        line = (
            f"{r['tiers']} {r['mode']} B={r['batch']}: {r['agg_tps']:.2f} tok/s, "
            f"{r['mib_per_token']:.2f} MiB/token, {r['wall_s']:.0f} s"
        )
        click.echo(line, err=True)

    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    result = run_bench(
        model_dir,
        mode_list,
        _ints(batches, "--batches"),
        list(stacks) or ["pread"],
        io_ratio,
        k,
        tokens,
        prompt_len,
        repeats,
        progress,
        same_prompt,
    )
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1))
    cal = result["calibration"]
    if cal is not None:
        click.echo(
            f"calibration (reactive B=1, pread): compute {cal['compute_ms_per_step']:.1f} "
            f"ms/step, reads {cal['mib_per_token']:.2f} MiB/token"
        )
    click.echo(markdown(result), nl=False)
    click.echo(f"load average {result['load_avg']:.1f} on {result['cpus']} CPUs at the end")
