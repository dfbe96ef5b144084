"""`edge0 verify DIR`: check an edge0-layout directory's manifest, sizes and every CRC."""

from __future__ import annotations

import click


@click.command("verify")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def command(directory: str) -> None:
    """Check DIR: manifest, file sizes and the CRC32 of every expert record."""
    from edge0.layout.verify import verify

    report = verify(directory)
    extra = " (experts.bin and experts.zst)" if report.zstd else ""
    click.echo(
        f"ok: {report.records} records, {report.bytes / 1e9:.2f} GB checked{extra} "
        f"in {report.seconds:.1f} s ({report.gb_per_s:.2f} GB/s)"
    )
