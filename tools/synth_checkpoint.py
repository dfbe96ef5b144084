"""Write a random-weight checkpoint with the exact shape of a real MoE model.

    python tools/synth_checkpoint.py --shape qwen3.5-35b-a3b Q35
    python tools/synth_checkpoint.py --shape small --format hf small-hf
    python tools/synth_checkpoint.py --shape mixtral-8x7b --plan

Shapes: the Qwen3.5 35B-A3B family and small test shapes, plus each supported family's
flagship (mixtral-8x7b, olmoe-1b-7b, qwen1.5-moe-a2.7b, deepseek-v2-lite,
moonlight-16b-a3b, glm-4.5-air; qwen3-30b-a3b for qwen3_moe).

The default format is the edge0 layout at int4 (random packed weights, sane scales);
`--format hf` writes a bf16 Hugging Face checkpoint (small shapes only), input for
`edge0 convert`. `--zero-experts` leaves every expert record a hole of zeros in a
sparse experts.bin: only the resident file takes disk (memory figures of a shape too
big for the disk; reading a hole needs no disk I/O, so its read times mean nothing).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge0.errors import Edge0Error  # noqa: E402
from edge0.synth.hf import MAX_HF_BYTES, write_hf  # noqa: E402
from edge0.synth.layout import SHAPES, plan_sizes, synthesize  # noqa: E402


@click.command()
@click.option("--shape", type=click.Choice(SHAPES), required=True)
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
def main(
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
    """Write a random checkpoint of SHAPE into DST (or, with --plan, print its sizes)."""
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
    except Edge0Error as exc:
        click.echo(f"synth_checkpoint: error: {exc}", err=True)
        sys.exit(2)
    click.echo(
        f"wrote {dst}: {size / 1e9:.2f} GB in {time.perf_counter() - start:.1f} s"
        + (f" ({disk / 1e9:.2f} GB on disk: the experts are holes)" if zero_experts else "")
        + (f" (HF format is limited to {MAX_HF_BYTES / 1e9:.0f} GB)" if fmt == "hf" else "")
    )


if __name__ == "__main__":
    main()
