"""Merge a LoRA adapter into its base projections: dequantize, add scale * B A, requantize."""

from __future__ import annotations

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from edge0.log import get_logger
from edge0.model.lora import LoRALinear, lora_modules

log = get_logger(__name__)


@attrs.frozen
class MergeStats:
    """How much of the dense update survives requantization, over all merged projections.

    retained = <Q(W + D) - Q(W), D> / ||D||^2: the share of the update D = scale * B A
    that the requantized weights still carry. Rounding is unbiased on average, so this
    stays near 1 even for tiny updates; `residual` says whether the update survives as
    signal (<< 1) or drowns in rounding noise (>= 1). W is the
    dequantized int4 base and Q(W) its own requantization (requantizing a dequantized
    int4 weight is not exactly idempotent in MLX, so the reference goes through Q too).
    """

    modules: int
    update_norm: float  # ||D|| over all modules
    retained: float  # projection of the realised change onto D, / ||D||^2
    residual: float  # ||(Q(W + D) - Q(W)) - D|| / ||D||


def _dequantized(base: nn.Module) -> mx.array:
    """The base weight as fp32 (out, in)."""
    if isinstance(base, nn.QuantizedLinear):
        from edge0.model.loaded import activation_dtype

        wide = activation_dtype(base.scales.dtype)  # scales may be kept narrower (layout.load)
        biases = base.get("biases")
        w = mx.dequantize(
            base.weight,
            base.scales.astype(wide),
            biases.astype(wide) if biases is not None else None,
            group_size=base.group_size,
            bits=base.bits,
            mode=base.mode,
        )
        return w.astype(mx.float32)
    return base.weight.astype(mx.float32)


def _merged_layer(m: LoRALinear, requantize: bool) -> tuple[nn.Module, mx.array, mx.array]:
    """(new layer, D, realised change Q(W + D) - Q(W)) for one adapter."""
    base = m.linear
    w = _dequantized(base)  # (out, in) fp32
    d = m.delta_weight()  # (out, in) fp32
    out_dims, in_dims = w.shape
    has_bias = "bias" in base
    dense = nn.Linear(in_dims, out_dims, bias=has_bias)
    if isinstance(base, nn.QuantizedLinear) and requantize:
        dense.weight = w + d
        if has_bias:
            dense.bias = base.bias
        new: nn.Module = nn.QuantizedLinear.from_linear(
            dense, group_size=base.group_size, bits=base.bits, mode=base.mode
        )
        ref = nn.QuantizedLinear.from_linear(
            nn.Linear(in_dims, out_dims, bias=False), group_size=base.group_size, bits=base.bits
        )
        ref.weight, ref.scales, ref.biases = mx.quantize(
            w, group_size=base.group_size, bits=base.bits, mode=base.mode
        )
        realised = _dequantized(new) - _dequantized(ref)
    else:
        dtype = base.weight.dtype if not isinstance(base, nn.QuantizedLinear) else mx.float32
        dense.weight = (w + d).astype(dtype)
        if has_bias:
            dense.bias = base.bias
        new = dense
        realised = dense.weight.astype(mx.float32) - w
    return new, d, realised


def merge_lora(model: nn.Module, requantize: bool = True) -> MergeStats:
    """Replace every LoRALinear by a plain layer carrying W + scale * B A (in place).

    Args:
        model: a model with adapters applied (edge0.model.lora.apply_lora / load_adapters).
        requantize: int4 bases are requantized with their own group size, bits and
            mode (what a merged int4 checkpoint ships); False keeps the merged weight
            dense fp32, the "merged before requantization" reference.

    Returns:
        MergeStats over all merged projections.
    """
    mods = lora_modules(model)
    replaced = []
    d2 = dot = res2 = 0.0
    for path, m in mods:
        new, d, realised = _merged_layer(m, requantize)
        replaced.append((path, new))
        d2 += float((d * d).sum())
        dot += float((realised * d).sum())
        diff = realised - d
        res2 += float((diff * diff).sum())
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    mx.eval(model.parameters())
    norm = d2**0.5
    stats = MergeStats(
        modules=len(mods),
        update_norm=norm,
        retained=dot / d2 if d2 > 0 else 0.0,
        residual=(res2**0.5) / norm if norm > 0 else 0.0,
    )
    log.info("lora.merged", requantize=requantize, **attrs.asdict(stats))
    return stats
