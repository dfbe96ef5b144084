"""`edge0 verify DIR`: a layout's manifest, sizes, every CRC and its heads, checked."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("verify")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def command(directory: str) -> None:
    """Check DIR: manifest, file sizes, the CRC32 of every expert record and file, and the
    prerouter heads, opened as `edge0 run` opens them."""
    from edge0.layout.manifest import Manifest
    from edge0.layout.verify import verify
    from edge0.routing.prerouter_files import check_heads

    report = verify(directory)
    manifest = Manifest.load(Path(directory))
    d_model = manifest.field("down_proj.weight").shape[0]  # (d_model, d_ff) per expert
    heads = check_heads(Path(directory), manifest.moe_layers, manifest.n_experts, d_model)
    extra = " (experts.bin and experts.zst)" if report.zstd else ""
    click.echo(
        f"ok: {report.records} records, {report.bytes / 1e9:.2f} GB checked{extra} "
        f"in {report.seconds:.1f} s ({report.gb_per_s:.2f} GB/s)"
    )
    if heads:
        note = (
            f"; no CRC32 recorded for {', '.join(report.unrecorded)}" if report.unrecorded else ""
        )
        click.echo(f"prerouter heads ({', '.join(heads)} horizon) open as a run opens them{note}")
