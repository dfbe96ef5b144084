"""`edge0 synth`: random-weight checkpoints with the exact shape of a real MoE model.

edge0 synth --shape qwen3.5-35b-a3b Q35
edge0 synth --shape small --format hf small-hf
edge0 synth --shape mixtral-8x7b --plan
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from edge0.errors import ConfigError, Edge0Error


@click.command("synth")
@click.option(
    "--shape",
    required=True,
    help="A named shape: qwen3.5-35b-a3b, medium, small, tiny, or a family's flagship "
    "(mixtral-8x7b, gpt-oss-20b, ...); a wrong name lists them all.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["edge0", "hf"]), default="edge0", show_default=True
)
@click.option("--bits", default=4, show_default=True)
@click.option("--group-size", default=64, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--shards", default=0, help="HF format: number of shards (0: ~2 GB each).")
@click.option(
    "--compress",
    type=click.Choice(["zstd"]),
    default=None,
    help="Edge0 format: also write experts.zst.",
)
@click.option(
    "--zero-experts",
    is_flag=True,
    help="Edge0 format: every expert record all zeros, left as holes in a sparse experts.bin "
    "(only the resident file takes disk): memory figures of a shape too big for the disk.",
)
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
@click.option(
    "--plan",
    is_flag=True,
    help="Print the shape's resident and expert bytes in the edge0 layout; write nothing.",
)
@click.argument("dst", type=click.Path(file_okay=False), required=False)
def command(
    shape: str,
    fmt: str,
    bits: int,
    group_size: int,
    seed: int,
    shards: int,
    compress: str | None,
    zero_experts: bool,
    force: bool,
    plan: bool,
    dst: str | None,
) -> None:
    """Write a random checkpoint with the exact shape of a real MoE model into DST (or, with
    --plan, print its sizes): the edge0 layout at int4 by default (random packed weights,
    sane scales), or with --format hf a bf16 Hugging Face checkpoint for `edge0 convert`
    (small shapes). --zero-experts leaves every expert record a hole of zeros in a sparse
    experts.bin, so only the resident file takes disk (memory figures of a shape too big
    for the disk; reading a hole needs no I/O, so its read times mean nothing)."""
    from edge0.synth.layout import plan_sizes
    from edge0.synth.shapes import SHAPES

    if shape not in SHAPES:
        raise ConfigError(f"--shape {shape!r} is not one of {', '.join(SHAPES)}")
    start = time.perf_counter()
    if plan:
        p = plan_sizes(shape, bits=bits, group_size=group_size)
        click.echo(
            f"{shape} ({p['model_type']}): {p['moe_layers']} of {p['layers']} layers sparse, "
            f"{p['experts']} experts, top-{p['top_k']}; resident {p['resident_bytes'] / 2**30:.2f} "
            f"GiB, experts {p['experts_bytes'] / 2**30:.2f} GiB ({p['record_bytes'] / 2**20:.2f} "
            f"MiB per {p['expert_mode']} expert record); streamed at top-{p['top_k']}: first "
            f"layer's experts {p['first_layer_bytes'] / 2**30:.2f} GiB + slot tables "
            f"{p['slot_bytes'] / 2**30:.2f} GiB"
        )
        return
    if dst is None:
        raise click.UsageError("DST is required unless --plan is given")
    if zero_experts and (fmt == "hf" or compress):
        raise click.UsageError("--zero-experts writes the edge0 format, uncompressed")
    from edge0.synth.hf import MAX_HF_BYTES, write_hf
    from edge0.synth.layout import synthesize

    try:
        if fmt == "hf":
            size = write_hf(shape, Path(dst), seed=seed, shards=shards, force=force)
        else:
            m = synthesize(
                shape,
                dst,
                bits=bits,
                group_size=group_size,
                seed=seed,
                force=force,
                compress=compress,
                zero_experts=zero_experts,
            )
            size = sum(f.stat().st_size for f in Path(dst).iterdir())
            disk = sum(f.stat().st_blocks * 512 for f in Path(dst).iterdir())
            click.echo(f"{m.n_records} records of {m.record_size} B")
    except Edge0Error:
        raise  # the CLI's one line
    click.echo(
        f"wrote {dst}: {size / 1e9:.2f} GB in {time.perf_counter() - start:.1f} s"
        + (f" ({disk / 1e9:.2f} GB on disk: the experts are holes)" if zero_experts else "")
        + (f" (HF format is limited to {MAX_HF_BYTES / 1e9:.0f} GB)" if fmt == "hf" else "")
    )
