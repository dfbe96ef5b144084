"""`edge0 convert`: an HF (bf16/fp16/fp32) or mlx-community int4 checkpoint -> the edge0 layout.

Steps: open the source (headers only); build the float-shaped mlx-lm model to learn the
MoE layers and expert shapes; write resident.safetensors tensor by tensor; write one
record per (layer, expert), quantizing HF experts one at a time (MLX experts are
repacked bit-exactly, never requantized); copy tokenizer files; write edge0.json last.
Everything goes to a temporary directory renamed to DST only on success.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from edge0.errors import ConversionError
from edge0.layout.artifacts import artifact_crcs
from edge0.layout.atomic import atomic_directory, check_destination, check_free_space
from edge0.layout.convert_quant import (
    ConvertOptions,
    ExpertShape,
    _bias_dtype,
    _check_options,
    _expert_params,
    _expert_shape,
    _quant_defaults,
    _resident_bits,
    _scale_dtype,
)
from edge0.layout.crc import crc32, file_crc32
from edge0.layout.manifest import RESIDENT_FILE, Manifest
from edge0.layout.manifest_checks import FORMAT_VERSION
from edge0.layout.model import build_float_model
from edge0.layout.quant import conversion_dtype, quantize
from edge0.layout.readable import ARTIFACT_FILES, TOKENIZER_FILES, check_present
from edge0.layout.records import (
    PROJECTIONS,
    RecordSpec,
    pack_record,
    projection_quant,
    record_layout,
)
from edge0.layout.resident import write_resident
from edge0.layout.safetensors_io import header_bytes, to_mx, to_raw
from edge0.layout.sources import Source, open_source
from edge0.layout.writer import RecordWriter
from edge0.log import get_logger

log = get_logger(__name__)


def _expert_arrays(
    source: Source, layer: int, expert: int, params: dict[str, Any], cast: mx.Dtype | None
) -> dict[str, np.ndarray]:
    parts = source.read_expert(layer, expert)
    out: dict[str, np.ndarray] = {}
    for proj in PROJECTIONS:
        if f"{proj}.bias" in parts:  # experts with biased projections
            raw, dtype = parts.pop(f"{proj}.bias")
            b = to_mx(raw, dtype)
            out[f"{proj}.bias"] = to_raw(b.astype(cast) if cast is not None else b)
    if source.quantized or source.packed is not None:
        return {**{name: raw for name, (raw, _) in parts.items()}, **out}
    for proj in PROJECTIONS:
        raw, dtype = parts[proj]
        w = to_mx(raw, dtype)
        if cast is not None:
            w = w.astype(cast)
        triple = quantize(w, projection_quant(params, proj))
        mx.eval(*triple)
        for part, arr in zip(("weight", "scales", "biases"), triple, strict=True):
            out[f"{proj}.{part}"] = to_raw(arr)
    return out


def _write_experts(
    source: Source,
    shape: ExpertShape,
    spec: RecordSpec,
    params: dict[str, Any],
    tmp: Path,
    opts: ConvertOptions,
) -> RecordWriter:
    cast = None if source.quantized else conversion_dtype(source.config)
    level = opts.zstd_level if opts.compress == "zstd" else None
    record = np.zeros(spec.record_size, dtype=np.uint8)
    total = len(shape.layers) * shape.n_experts * spec.record_size
    with (
        RecordWriter(tmp, spec.record_size, level) as writer,
        tqdm(total=total, desc="experts", unit="B", unit_scale=True, disable=None) as bar,
    ):
        for layer in shape.layers:
            for expert in range(shape.n_experts):
                pack_record(spec, _expert_arrays(source, layer, expert, params, cast), out=record)
                writer.write(record)
                bar.update(spec.record_size)
    return writer


ARTIFACT_DIRS = ("adapters",)  # with ARTIFACT_FILES: quality artifacts travel with the model


def _copy_side_files(src: Path, dst: Path, config: dict[str, Any]) -> None:
    for name in (*TOKENIZER_FILES, *ARTIFACT_FILES):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    for name in ARTIFACT_DIRS:
        if (src / name).is_dir():
            shutil.copytree(src / name, dst / name)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def convert(src: Path | str, dst: Path | str, opts: ConvertOptions | None = None) -> Manifest:
    """Convert the checkpoint in `src` into an edge0-layout directory `dst`.

    Raises:
        ConversionError: unsupported or inconsistent source, DST exists without force, or
            options that would requantize an already-quantized checkpoint.
    """
    opts = opts or ConvertOptions()
    src, dst = Path(src), Path(dst)
    _check_options(opts)
    check_destination(dst, opts.force, src)
    check_present(
        src,
        (*TOKENIZER_FILES, *ARTIFACT_FILES),
        "fix or remove it in SRC, then run again",
        ConversionError,
    )
    start = time.perf_counter()
    source = open_source(src)
    model = build_float_model(source.config)
    shape = _expert_shape(source, model)
    params = _quant_defaults(source, shape, opts)
    expert_params = _expert_params(source, shape, params, model)
    resident_bits = _resident_bits(source, opts)
    spec = record_layout(
        shape.d_model,
        shape.d_ff,
        expert_params["bits"],
        expert_params["group_size"],
        _scale_dtype(source, expert_params),
        expert_params["mode"],
        _bias_dtype(source),
        expert_params.get("projections"),
    )
    experts_bytes = len(shape.layers) * shape.n_experts * spec.record_size
    resident_bytes = sum(source.tensors[k].nbytes for k in source.resident_keys)  # upper bound
    need = experts_bytes * (2 if opts.compress else 1) + resident_bytes
    check_free_space(dst, need, f"converting {src}")
    with atomic_directory(dst, opts.force, src) as tmp:
        config, _ = write_resident(source, model, params, tmp / RESIDENT_FILE, resident_bits)
        resident_crc = {
            "header": crc32(header_bytes(tmp / RESIDENT_FILE)),
            "file": file_crc32(tmp / RESIDENT_FILE),
        }
        writer = _write_experts(source, shape, spec, expert_params, tmp, opts)
        _copy_side_files(src, tmp, config)
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            model_type=config["model_type"],
            config=config,
            quantization=dict(expert_params),
            moe_layers=shape.layers,
            n_experts=shape.n_experts,
            record_size=spec.record_size,
            data_offset=0,
            fields=spec.fields,
            crc32=tuple(writer.crc32),
            compression=writer.compression(),
            resident_crc32=resident_crc,
            artifacts_crc32=artifact_crcs(tmp),
        )
        manifest.save(tmp)  # last: a directory without edge0.json is never taken for valid
    log.info(
        "convert.done",
        src=str(src),
        dst=str(dst),
        format=source.format,
        records=manifest.n_records,
        record_size=spec.record_size,
        seconds=round(time.perf_counter() - start, 2),
    )
    return manifest
