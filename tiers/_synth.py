"""A synthetic expert store (random int4-shaped records, manifest, zstd side file) for tier tests
and `edge0 bench tiers`: `python -m tiers._synth OUT --layers 8 --experts 32`."""

from __future__ import annotations

import zlib
from pathlib import Path

import click
import numpy as np
import zstandard

from edge0.layout.manifest import (
    EXPERTS_FILE,
    FIELD_ALIGN,
    FORMAT_VERSION,
    RECORD_ALIGN,
    ZSTD_FILE,
    ZSTD_INDEX_FILE,
    Manifest,
    RecordField,
)


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def record_fields(d_model: int, d_ff: int, bits: int = 4, group: int = 64) -> list[RecordField]:
    """gate/up (d_ff, d_model) and down (d_model, d_ff) as packed uint32 + fp16 scales/biases."""
    fields, offset = [], 0
    for proj, (rows, cols) in (("gate_proj", (d_ff, d_model)), ("up_proj", (d_ff, d_model)),
                               ("down_proj", (d_model, d_ff))):  # fmt: skip
        for kind, dtype, shape in (("weight", "uint32", (rows, cols * bits // 32)),
                                   ("scales", "float16", (rows, cols // group)),
                                   ("biases", "float16", (rows, cols // group))):  # fmt: skip
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            fields.append(RecordField(f"{proj}.{kind}", dtype, shape, offset, nbytes))
            offset = _round_up(offset + nbytes, FIELD_ALIGN)
    return fields


def make_record(fields: list[RecordField], size: int, rng: np.random.Generator) -> np.ndarray:
    rec = np.zeros(size, np.uint8)  # (record_size,) zero padding after the last field
    for f in fields:
        if f.dtype == "uint32":
            rec[f.offset : f.offset + f.nbytes] = rng.integers(0, 256, f.nbytes, np.uint8)
        else:  # scales/biases: small fp16 values, mildly compressible like real ones
            vals = rng.normal(0, 0.02, f.nbytes // 2).astype(np.float16)
            rec[f.offset : f.offset + f.nbytes] = vals.view(np.uint8)
    return rec


def write_store(
    out: Path,
    *,
    n_layers: int = 3,
    n_experts: int = 4,
    d_model: int = 64,
    d_ff: int = 32,
    zstd_level: int | None = 3,
    seed: int = 0,
) -> Manifest:
    """Write experts.bin (+ experts.zst/.idx) and edge0.json under `out`; return the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fields = record_fields(d_model, d_ff)
    size = _round_up(fields[-1].offset + fields[-1].nbytes, RECORD_ALIGN)
    data_offset = RECORD_ALIGN  # a header block, so offset arithmetic is exercised
    rng = np.random.default_rng(seed)
    cctx = zstandard.ZstdCompressor(level=zstd_level or 3, write_content_size=True)
    crcs, index, zpos = [], [], 0
    with open(out / EXPERTS_FILE, "wb") as fb, open(out / ZSTD_FILE, "wb") as fz:
        fb.write(b"EDGE0SYN".ljust(data_offset, b"\0"))
        for _ in range(n_layers * n_experts):
            rec = make_record(fields, size, rng)
            fb.write(rec.data)
            crcs.append(zlib.crc32(rec.data))
            if zstd_level is not None:
                frame = cctx.compress(rec.data)
                fz.write(frame)
                index.append((zpos, len(frame)))
                zpos += len(frame)
    if zstd_level is None:
        (out / ZSTD_FILE).unlink()
    else:
        np.asarray(index, "<u8").reshape(-1, 2).tofile(out / ZSTD_INDEX_FILE)
    compression = None
    if zstd_level is not None:
        compression = {"codec": "zstd", "level": zstd_level,
                       "file": ZSTD_FILE, "index": ZSTD_INDEX_FILE}  # fmt: skip
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        model_type="synthetic",
        config={
            "model_type": "synthetic",
            "hidden_size": d_model,
            "moe_intermediate_size": d_ff,
            "num_experts": n_experts,
        },  # fmt: skip
        quantization={"bits": 4, "group_size": 64, "mode": "affine"},
        moe_layers=tuple(range(1, n_layers + 1)),
        n_experts=n_experts,
        record_size=size,
        data_offset=data_offset,
        fields=tuple(fields),
        crc32=tuple(crcs),
        compression=compression,
    )
    manifest.save(out)
    return manifest


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--layers", default=8, show_default=True)
@click.option("--experts", default=32, show_default=True)
@click.option("--d-model", default=2048, show_default=True)
@click.option("--d-ff", default=512, show_default=True)
@click.option("--zstd-level", default=3, show_default=True)
def main(out: Path, layers: int, experts: int, d_model: int, d_ff: int, zstd_level: int) -> None:
    """Write a synthetic expert store (defaults: 35B-A3B expert shape, ~450 MB)."""
    m = write_store(out, n_layers=layers, n_experts=experts, d_model=d_model, d_ff=d_ff,
                    zstd_level=zstd_level)  # fmt: skip
    click.echo(f"{out}: {m.n_records} records of {m.record_size} bytes")


if __name__ == "__main__":
    main()
