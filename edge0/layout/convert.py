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
import zlib
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
from tqdm import tqdm

from edge0.errors import ConversionError
from edge0.layout.atomic import atomic_directory, check_destination, check_free_space
from edge0.layout.manifest import (
    FORMAT_VERSION,
    RESIDENT_FILE,
    Manifest,
)
from edge0.layout.manifest_checks import SUPPORTED_BITS, SUPPORTED_GROUPS
from edge0.layout.model import build_float_model
from edge0.layout.quant import conversion_dtype, quantize, switch_modules
from edge0.layout.records import MODES, PROJECTIONS, RecordSpec, pack_record, record_layout
from edge0.layout.resident import write_resident
from edge0.layout.safetensors_io import header_bytes, mx_dtype_name, to_mx, to_raw
from edge0.layout.sources import Source, expert_bias_dtype, expert_count, open_source
from edge0.layout.verify import file_crc32
from edge0.layout.writer import RecordWriter
from edge0.log import get_logger

log = get_logger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tiktoken.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


@attrs.frozen
class ConvertOptions:
    """Options of `edge0 convert` (None: 4 bits / group 64 for HF, the source's for MLX).

    embed_bits / attn_bits: bits of the token embedding + LM head / of the attention
    projections (None: the expert bits). HF sources only: MLX sources are never requantized.
    """

    bits: int | None = None
    embed_bits: int | None = None
    attn_bits: int | None = None
    group_size: int | None = None
    compress: str | None = None  # None or "zstd"
    zstd_level: int = 3
    force: bool = False


@attrs.frozen
class ExpertShape:
    layers: tuple[int, ...]  # model layer indices with routed experts
    n_experts: int
    d_model: int
    d_ff: int


def _expert_shape(source: Source, model: Any) -> ExpertShape:
    switch = switch_modules(model)
    layers = tuple(switch)
    if set(layers) != set(source.experts):
        raise ConversionError(
            f"{source.path}: the config has routed experts in layers {list(layers)}, the "
            f"weights in layers {sorted(source.experts)}; the checkpoint does not match its config"
        )
    n, d_ff, d_model = switch[layers[0]][1].gate_proj.weight.shape  # (E, ff, d)
    for layer in layers:
        found = expert_count(source.experts[layer])
        if found != n:
            raise ConversionError(f"{source.path}: layer {layer} has {found} experts, config {n}")
    return ExpertShape(layers, n, d_model, d_ff)


def _quant_defaults(source: Source, shape: ExpertShape, opts: ConvertOptions) -> dict[str, Any]:
    if not source.quantized:
        return {"group_size": opts.group_size or 64, "bits": opts.bits or 4, "mode": "affine"}
    le = source.experts[shape.layers[0]]
    w, s = le.tensors["gate_proj.weight"], le.tensors["gate_proj.scales"]
    found = {
        "group_size": shape.d_model // s.shape[-1],
        "bits": w.shape[-1] * 32 // shape.d_model,
        "mode": source.config["quantization"].get("mode", "affine"),
    }
    widths = {"gate_proj": shape.d_model, "up_proj": shape.d_model, "down_proj": shape.d_ff}
    per_proj = {p: le.tensors[f"{p}.weight"].shape[-1] * 32 // w for p, w in widths.items()}
    if len(set(per_proj.values())) > 1:
        raise ConversionError(
            f"{source.path}: the experts' projections are quantized with different bits "
            f"({', '.join(f'{p} {b}' for p, b in per_proj.items())}); the edge0 layout stores "
            "one bits/group size for all three: convert from the full-precision checkpoint"
        )
    first = {k: v.shape[1:] for k, v in le.tensors.items()}
    for layer in shape.layers:
        other = source.experts[layer].tensors
        if {k: v.shape[1:] for k, v in other.items()} != first:
            raise ConversionError(
                f"{source.path}: layer {layer}'s experts are quantized differently from layer "
                f"{shape.layers[0]}'s; the edge0 layout needs one record shape for all layers"
            )
    for name, want in (("bits", opts.bits), ("group_size", opts.group_size)):
        if want is not None and want != found[name]:
            raise ConversionError(
                f"{source.path} is already quantized with {name}={found[name]}; Edge0 repacks "
                f"MLX checkpoints without requantizing: drop --{name.replace('_', '-')} or "
                "convert from the full-precision checkpoint"
            )
    return found


def _expert_params(source: Source, shape: ExpertShape, params: dict[str, Any]) -> dict[str, Any]:
    """The experts' quantization: `params`, or a smaller group when the widths need one.

    mlx-lm leaves a module whose width is not a multiple of the group size in float;
    an expert record must be quantized, so the experts get the largest supported group
    that divides both widths (the resident modules keep `params`, as mlx-lm would).
    """
    if source.packed is not None:  # HF experts stored packed (MXFP4): kept as they are
        log.info("convert.experts_kept_packed", **source.packed)
        return dict(source.packed)
    group, bits = params["group_size"], params["bits"]
    dims = (shape.d_model, shape.d_ff)
    if source.quantized or all(d % group == 0 and d * bits % 32 == 0 for d in dims):
        return params
    fits = [g for g in SUPPORTED_GROUPS if g < group and all(d % g == 0 for d in dims)]
    if not fits or any(d * bits % 32 for d in dims):
        raise ConversionError(
            f"{source.path}: expert widths {shape.d_model} x {shape.d_ff} are not a multiple of "
            f"any supported group size ({', '.join(map(str, SUPPORTED_GROUPS))}) at {bits} bits; "
            "this model cannot be stored in the edge0 layout"
        )
    log.warning("convert.expert_group_reduced", requested=group, used=max(fits),
                d_model=shape.d_model, d_ff=shape.d_ff)  # fmt: skip
    return {**params, "group_size": max(fits)}


def _check_options(opts: ConvertOptions) -> None:
    if opts.compress not in (None, "zstd"):
        raise ConversionError(f"unknown --compress {opts.compress!r}; the choice is zstd")
    if opts.bits is not None and opts.bits not in SUPPORTED_BITS:
        raise ConversionError(
            f"--bits {opts.bits} is not supported; choose one of "
            f"{', '.join(map(str, SUPPORTED_BITS))} (4 is the default)"
        )
    if opts.group_size is not None and opts.group_size not in SUPPORTED_GROUPS:
        raise ConversionError(
            f"--group-size {opts.group_size} is not supported; choose one of "
            f"{', '.join(map(str, SUPPORTED_GROUPS))} (64 is the default)"
        )
    if not -7 <= opts.zstd_level <= 22:
        raise ConversionError(f"--zstd-level {opts.zstd_level} is outside zstd's -7..22")


RESIDENT_BITS = (4, 8)


def _resident_bits(source: Source, opts: ConvertOptions) -> dict[str, int]:
    chosen = {"embed": opts.embed_bits, "attn": opts.attn_bits}
    out = {kind: b for kind, b in chosen.items() if b is not None}
    for kind, b in out.items():
        if b not in RESIDENT_BITS:
            raise ConversionError(f"--{kind}-bits {b} is not one of {list(RESIDENT_BITS)}")
    if out and source.quantized:
        raise ConversionError(
            f"{source.path} is already quantized; Edge0 repacks MLX checkpoints without "
            "requantizing: drop --embed-bits/--attn-bits or convert from the full-precision "
            "checkpoint"
        )
    return out


def _scale_dtype(source: Source, params: dict[str, Any]) -> str:
    le = next(iter(source.experts.values()))
    if MODES[params["mode"]][1] is not None:
        return str(MODES[params["mode"]][1])  # mxfp4: uint8 scales
    if source.quantized:
        return le.tensors["gate_proj.scales"].dtype
    cast = conversion_dtype(source.config)
    if cast is not None:
        return mx_dtype_name(mx.zeros((0,), dtype=cast))
    return next(iter(le.tensors.values())).dtype


def _bias_dtype(source: Source) -> str | None:
    """Dtype of the experts' own biases in the record (cast as mlx-lm's convert casts)."""
    stored = expert_bias_dtype(source)
    cast = None if source.quantized else conversion_dtype(source.config)
    if stored is None or cast is None:
        return stored
    return mx_dtype_name(mx.zeros((0,), dtype=cast))


def _expert_arrays(
    source: Source, layer: int, expert: int, params: dict[str, Any], cast: mx.Dtype | None
) -> dict[str, np.ndarray]:
    parts = source.read_expert(layer, expert)
    out: dict[str, np.ndarray] = {}
    for proj in PROJECTIONS:
        if f"{proj}.bias" in parts:  # experts with biased projections (gpt-oss)
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
        triple = quantize(w, params)
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


# Quality artifacts trained for this model travel with it (docs/prerouter.md, docs/lora.md).
ARTIFACT_FILES = (
    "prerouter.safetensors",
    "prerouter.json",
    "prerouter-layer.safetensors",
    "prerouter-layer.json",
)
ARTIFACT_DIRS = ("adapters",)


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
    start = time.perf_counter()
    source = open_source(src)
    model = build_float_model(source.config)
    shape = _expert_shape(source, model)
    params = _quant_defaults(source, shape, opts)
    expert_params = _expert_params(source, shape, params)
    resident_bits = _resident_bits(source, opts)
    spec = record_layout(
        shape.d_model, shape.d_ff, expert_params["bits"], expert_params["group_size"],
        _scale_dtype(source, expert_params), expert_params["mode"], _bias_dtype(source),
    )  # fmt: skip
    experts_bytes = len(shape.layers) * shape.n_experts * spec.record_size
    resident_bytes = sum(source.tensors[k].nbytes for k in source.resident_keys)  # upper bound
    need = experts_bytes * (2 if opts.compress else 1) + resident_bytes
    check_free_space(dst, need, f"converting {src}")
    with atomic_directory(dst, opts.force, src) as tmp:
        config, _ = write_resident(source, model, params, tmp / RESIDENT_FILE, resident_bits)
        resident_crc = {
            "header": zlib.crc32(header_bytes(tmp / RESIDENT_FILE)),
            "file": file_crc32(tmp / RESIDENT_FILE),
        }
        writer = _write_experts(source, shape, spec, expert_params, tmp, opts)
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
        )
        _copy_side_files(src, tmp, config)
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
