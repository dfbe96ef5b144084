"""How `edge0 convert` quantizes: its options, the experts' shape, their bits and dtypes.

HF experts get the chosen bits / group size (a smaller group where the widths need one)
and, per projection, what mlx-lm's `quant_predicate` gives them (e.g. down_proj
at 8 bits); MLX sources keep what they store, projection by projection; hub MXFP4
experts stay MXFP4.
"""

from __future__ import annotations

from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn

from edge0.errors import ConversionError
from edge0.layout.manifest_checks import SUPPORTED_BITS, SUPPORTED_GROUPS
from edge0.layout.quant import conversion_dtype, expert_projections, switch_modules
from edge0.layout.records import MODES
from edge0.layout.safetensors_io import mx_dtype_name
from edge0.layout.sources import Source, expert_bias_dtype, expert_count
from edge0.log import get_logger

log = get_logger(__name__)


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
    widths = {"gate_proj": shape.d_model, "up_proj": shape.d_model, "down_proj": shape.d_ff}
    per_proj = {
        p: {
            "bits": le.tensors[f"{p}.weight"].shape[-1] * 32 // width,
            "group_size": width // le.tensors[f"{p}.scales"].shape[-1],
        }
        for p, width in widths.items()
    }
    found: dict[str, Any] = {
        **per_proj["gate_proj"],
        "mode": source.config["quantization"].get("mode", "affine"),
    }
    own = {p: q for p, q in per_proj.items() if q != per_proj["gate_proj"]}
    if own:  # mlx-lm gave some projections their own bits (e.g. down_proj at 8)
        found["projections"] = own
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


def _expert_params(
    source: Source, shape: ExpertShape, params: dict[str, Any], model: nn.Module | None = None
) -> dict[str, Any]:
    """The experts' quantization: `params` (with the projections mlx-lm's predicate quantizes
    otherwise), or a smaller group when the widths need one.

    mlx-lm leaves a module whose width is not a multiple of the group size in float;
    an expert record must be quantized, so the experts get the largest supported group
    that divides both widths (the resident modules keep `params`, as mlx-lm would).
    """
    if source.packed is not None:  # HF experts stored packed (MXFP4): kept as they are
        log.info("convert.experts_kept_packed", **source.packed)
        return dict(source.packed)
    group, bits = params["group_size"], params["bits"]
    dims = (shape.d_model, shape.d_ff)
    if source.quantized:
        return params
    if all(d % group == 0 and d * bits % 32 == 0 for d in dims):
        return _with_projections(model, params)
    fits = [g for g in SUPPORTED_GROUPS if g < group and all(d % g == 0 for d in dims)]
    if not fits or any(d * bits % 32 for d in dims):
        raise ConversionError(
            f"{source.path}: expert widths {shape.d_model} x {shape.d_ff} are not a multiple of "
            f"any supported group size ({', '.join(map(str, SUPPORTED_GROUPS))}) at {bits} bits; "
            "this model cannot be stored in the edge0 layout"
        )
    log.warning(
        "convert.expert_group_reduced",
        requested=group,
        used=max(fits),
        d_model=shape.d_model,
        d_ff=shape.d_ff,
    )
    return _with_projections(model, {**params, "group_size": max(fits)})


def _with_projections(model: nn.Module | None, params: dict[str, Any]) -> dict[str, Any]:
    """`params` plus the projections mlx-lm's predicate quantizes otherwise (e.g. down 8)."""
    own = expert_projections(model, params) if model is not None else {}
    return {**params, "projections": own} if own else params


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
