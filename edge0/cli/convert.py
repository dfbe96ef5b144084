"""`edge0 convert SRC DST`: write the edge0 layout from an HF or mlx-community checkpoint."""

from __future__ import annotations

import time

import click


@click.command("convert")
@click.argument("src")
@click.argument("dst", type=click.Path(file_okay=False))
@click.option(
    "--bits",
    type=int,
    default=None,
    help="Bits per expert weight [default: 4; MLX sources keep theirs].",
)
@click.option(
    "--group-size",
    type=int,
    default=None,
    help="Quantization group size [default: 64; MLX sources keep theirs].",
)
@click.option(
    "--compress",
    type=click.Choice(["zstd"]),
    default=None,
    help="Also write experts.zst (one zstd frame per record) for the zstd tier.",
)
@click.option(
    "--embed-bits",
    type=click.Choice(["4", "8"]),
    default=None,
    help="Bits of the token embedding and LM head [default: the expert bits].",
)
@click.option(
    "--attn-bits",
    type=click.Choice(["4", "8"]),
    default=None,
    help="Bits of the attention projections [default: the expert bits].",
)
@click.option("--zstd-level", type=int, default=3, show_default=True)
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
def command(
    src: str,
    dst: str,
    bits: int | None,
    group_size: int | None,
    embed_bits: str | None,
    attn_bits: str | None,
    compress: str | None,
    zstd_level: int,
    force: bool,
) -> None:
    """Convert the checkpoint in SRC (a directory, or a Hugging Face id ORG/NAME[@REVISION],
    downloaded into the Hugging Face cache) into an edge0-layout directory DST."""
    import sys

    from edge0.cli.checks import model_arg

    model_arg(src)  # before the converter's imports (mlx-lm, seconds)
    from edge0.hub.resolve import source
    from edge0.layout.convert import ConvertOptions, convert

    start = time.perf_counter()
    opts = ConvertOptions(
        bits=bits,
        group_size=group_size,
        embed_bits=int(embed_bits) if embed_bits else None,
        attn_bits=int(attn_bits) if attn_bits else None,
        compress=compress,
        zstd_level=zstd_level,
        force=force,
    )
    m = convert(source(src, progress=sys.stderr.isatty()), dst, opts)
    size = m.experts_file_size
    click.echo(
        f"wrote {dst}: {len(m.moe_layers)} MoE layers x {m.n_experts} experts, "
        f"{m.n_records} records of {m.record_size} B ({size / 1e9:.2f} GB), "
        f"int{m.quantization['bits']} group {m.quantization['group_size']}, "
        f"{time.perf_counter() - start:.1f} s"
    )
