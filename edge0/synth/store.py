"""A synthetic expert store alone (random records, manifest, zstd side file), no model around it.

For the tier tests and `edge0 bench tiers`: `python -m edge0.synth.store OUT`
(defaults: 8 layers x 32 experts of the 35B-A3B expert shape, ~450 MB). Records
use the checkpoint format's own layout and writer (edge0.layout.records,
edge0.layout.writer); the data starts after one RECORD_ALIGN header block, so
readers' offset arithmetic is exercised.
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from edge0.layout.manifest import Manifest
from edge0.layout.manifest_checks import FORMAT_VERSION
from edge0.layout.records import RECORD_ALIGN, RecordSpec, pack_record, record_layout
from edge0.layout.writer import RecordWriter


def random_record(spec: RecordSpec, rng: np.random.Generator) -> np.ndarray:
    """Random packed weights; small fp16 scales/biases (mildly compressible, like real ones)."""
    arrays = {}
    for f in spec.fields:
        if f.dtype == "uint32":
            arrays[f.name] = rng.integers(0, 256, f.nbytes, np.uint8).view(np.uint32)
        else:
            arrays[f.name] = rng.normal(0, 0.02, f.nbytes // 2).astype(np.float16)
        arrays[f.name] = arrays[f.name].reshape(f.shape)
    return pack_record(spec, arrays)


def write_store(
    out: Path,
    *,
    n_layers: int = 3,
    n_experts: int = 4,
    d_model: int = 64,
    d_ff: int = 32,
    group_size: int = 32,
    zstd_level: int | None = 3,
    seed: int = 0,
) -> Manifest:
    """Write experts.bin (+ experts.zst/.idx) and edge0.json under `out`; return the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec = record_layout(d_model, d_ff, bits=4, group_size=group_size, scale_dtype="float16")
    header = b"EDGE0SYN".ljust(RECORD_ALIGN, b"\0")
    rng = np.random.default_rng(seed)
    with RecordWriter(out, spec.record_size, zstd_level, header=header) as writer:
        for _ in range(n_layers * n_experts):
            writer.write(random_record(spec, rng))
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        model_type="synthetic",
        config={
            "model_type": "synthetic",
            "hidden_size": d_model,
            "moe_intermediate_size": d_ff,
            "num_experts": n_experts,
        },
        quantization={"bits": 4, "group_size": group_size, "mode": "affine"},
        moe_layers=tuple(range(1, n_layers + 1)),
        n_experts=n_experts,
        record_size=spec.record_size,
        data_offset=len(header),
        fields=spec.fields,
        crc32=tuple(writer.crc32),
        compression=writer.compression(),
    )
    manifest.save(out)
    return manifest


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--layers", default=8, show_default=True)
@click.option("--experts", default=32, show_default=True)
@click.option("--d-model", default=2048, show_default=True)
@click.option("--d-ff", default=512, show_default=True)
@click.option("--group-size", default=64, show_default=True)
@click.option("--zstd-level", default=3, show_default=True)
def main(
    out: Path,
    layers: int,
    experts: int,
    d_model: int,
    d_ff: int,
    group_size: int,
    zstd_level: int,
) -> None:
    """Write a synthetic expert store (defaults: 35B-A3B expert shape, ~450 MB)."""
    m = write_store(
        out,
        n_layers=layers,
        n_experts=experts,
        d_model=d_model,
        d_ff=d_ff,
        group_size=group_size,
        zstd_level=zstd_level,
    )
    click.echo(f"{out}: {m.n_records} records of {m.record_size} bytes")


if __name__ == "__main__":
    main()
