"""`edge0 bench`: benchmarks; `edge0 bench tiers DIR` measures storage tier stacks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs
import click
from tqdm import tqdm

from edge0.layout.manifest import Manifest


@click.group(name="bench")
def command() -> None:
    """Benchmarks: storage tiers, end-to-end runs and sweeps, plots."""


@command.command(name="tiers")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--tiers",
    "specs",
    multiple=True,
    metavar="SPEC",
    help="Tier stack to measure (repeatable), e.g. 'ram:1GiB>direct'. "
    "Default: every built-in tier and throttle preset.",
)
@click.option(
    "--reads", default=64, show_default=True, help="Random distinct expert records read per pass."
)
@click.option(
    "--qd",
    "qds",
    default="1,2,3,4",
    show_default=True,
    help="Queue depths (reads in flight), comma-separated.",
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--aligned",
    is_flag=True,
    help="Read into page-aligned buffers (default: address % 4096 == 24, like MLX).",
)
@click.option(
    "--compare-readers",
    is_flag=True,
    help="Also time sync preadv, executor preadv and aiofiles on hot pages.",
)
@click.option(
    "--json",
    "json_out",
    is_flag=False,
    flag_value="-",
    default=None,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write the rows as JSON to this file ('-' or no value: stdout).",
)
def tiers(
    model_dir: Path,
    specs: tuple[str, ...],
    reads: int,
    qds: str,
    seed: int,
    aligned: bool,
    compare_readers: bool,
    json_out: str | None,
) -> None:
    """Random expert reads per tier stack at queue depth 1-4, cold and warm.

    Cold: the store's page cache is dropped (posix_fadvise DONTNEED) and the
    stack is opened fresh. Warm: the same records read again right after.
    Throttle rows show the set bandwidth and what the device model allows at
    that queue depth (min(bw, QD x bytes / (lat + bytes / bw))) next to the
    measured MB/s.
    """
    from edge0.bench import tiers as bench_tiers

    manifest = Manifest.load(model_dir)
    if not specs:
        specs = tuple(s for s in bench_tiers.DEFAULT_SPECS if s != "zstd" or manifest.compression)
    depths = [int(q) for q in qds.split(",") if q.strip()]
    rows = []
    for spec in tqdm(specs, desc="bench tiers", unit="stack", leave=False, disable=None):
        rows += bench_tiers.run_bench(
            model_dir, [spec], reads=reads, qds=depths, seed=seed, aligned=aligned
        )
    size = manifest.record_size
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    readers = bench_tiers.compare_readers(model_dir) if compare_readers else None
    if json_out is not None:
        out: dict = {
            "model_dir": str(model_dir),
            "record_size": size,
            "load_average": load,
            "cpus": os.cpu_count(),
            "rows": [attrs.asdict(r) for r in rows],
        }
        if readers is not None:
            out["readers_us"] = readers
        if json_out == "-":
            click.echo(json.dumps(out, indent=1))
            return
        Path(json_out).write_text(json.dumps(out, indent=1))
        click.echo(f"wrote {json_out}", err=True)
    click.echo(
        f"{model_dir}: {manifest.n_records} records of {size / 2**20:.2f} MiB, "
        f"{len(rows) // (2 * len(depths))} stacks x {reads} reads per pass; "
        f"load average {load:.1f} on {os.cpu_count()} CPUs at the end"
    )
    click.echo(bench_tiers.format_table(rows))
    if readers is not None:
        click.echo(
            "\nper hot-page read (us): " + ", ".join(f"{k} {v:.0f}" for k, v in readers.items())
        )


def _register() -> None:
    from edge0.cli import bench_budget

    command.add_command(bench_budget.command)


_register()
