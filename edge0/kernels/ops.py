"""The ops the engine calls: quantized matmul, the experts' FFN (or a whole MoE block), a float
linear, RMSNorm, RoPE, attention, a Gated-DeltaNet layer's recurrent part.

Each runs the native kernel when it can (extension loaded, CPU device, float32 input, a
quantization it knows) and MLX's own op otherwise; the caller never knows which ran.
RMSNorm and RoPE give MLX's CPU result bit for bit, in one graph node instead of 11 and 29;
attention (a decode step's queries or a prompt chunk's) is one node instead of about 12,
and a row of a left-padded batch gets exactly its result alone (hidden keys are skipped,
not weighted by zero). A Gated-DeltaNet layer between its projections (conv, gates,
recurrence, gated norm) is one node instead of about 70, MLX's CPU result bit for bit.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import mlx.core as mx

from edge0.kernels.native import module, on_cpu

GROUPS = (32, 64, 128)


def supported(bits: int, group_size: int, mode: str, scales: mx.array) -> bool:
    """Whether the native kernels know this quantization (affine 4/8-bit with float scales,
    groups of 32, 64 or 128; MXFP4)."""
    if mode == "affine":
        return bits in (4, 8) and group_size in GROUPS and scales.dtype != mx.uint8
    return mode == "mxfp4" and bits == 4 and group_size == 32


def qmm(
    x: mx.array,
    w: mx.array,
    scales: mx.array,
    biases: mx.array | None,
    group_size: int,
    bits: int,
    mode: str = "affine",
) -> mx.array:
    """x @ dequantize(w).T, as `mx.quantized_matmul(..., transpose=True)`."""
    mod = module()
    if (
        mod is not None
        and x.dtype == mx.float32
        and w.ndim == 2
        and x.size > 0
        and supported(bits, group_size, mode, scales)
        and on_cpu()
    ):
        out: mx.array = mod.qmm(x, w, scales, biases, group_size, bits, mode)
        return out
    return mx.quantized_matmul(
        x, w, scales, biases, transpose=True, group_size=group_size, bits=bits, mode=mode
    )


def activation_kind(activation: Any) -> tuple[str, float, float] | None:
    """The native name and parameters of an mlx-lm expert activation, or None if unknown."""
    name = type(activation).__name__
    if name == "SwiGLU":
        return "swiglu", 0.0, 0.0
    if name == "SwigluOAI":
        return "swiglu_oai", float(activation._alpha), float(activation._limit)
    return None


# one projection: weight, scales, biases, bias, group size, bits, mode (edge0.runtime.block)
Proj = tuple[mx.array, mx.array, "mx.array | None", "mx.array | None", int, int, str]


def expert_ffn(
    h: mx.array, idx: mx.array, up: Proj, gate: Proj, down: Proj, activation: Any
) -> mx.array | None:
    """The gated FFN of rows `h` (..., 1, d) with the expert slots `idx` (...) in one native
    op: (broadcast of the leading shapes, 1, d_out). None when only MLX's ops can run it."""
    mod = module()
    if mod is None or h.dtype != mx.float32 or not expert_ffn_runs(up, gate, down, activation):
        return None
    d = h.shape[-1]
    lead = tuple(mx.broadcast_shapes(tuple(h.shape[:-2]), tuple(idx.shape)))
    x = mx.broadcast_to(h.reshape(*h.shape[:-2], d), (*lead, d)).reshape(-1, d)
    rows = mx.broadcast_to(idx, lead).reshape(-1).astype(mx.uint32)
    act = activation_kind(activation)
    assert act is not None  # expert_ffn_runs checked it
    arrays, meta = _operands((gate, up, down))
    out: mx.array = mod.expert_ffn(x, rows, arrays, meta, *act)
    return out.reshape(*lead, 1, out.shape[-1])


def expert_ffn_runs(up: Proj, gate: Proj, down: Proj, activation: Any) -> bool:
    """Whether `expert_ffn` runs these projections natively (for float32 rows)."""
    if module() is None or activation_kind(activation) is None or not on_cpu():
        return False
    return all(supported(p[5], p[4], p[6], p[1]) and p[0].ndim == 3 for p in (gate, up, down))


def _operands(projs: tuple[Proj, Proj, Proj]) -> tuple[list[mx.array | None], list[int]]:
    arrays: list[mx.array | None] = []
    meta: list[int] = []
    for w, scales, biases, bias, group_size, bits, mode in projs:
        arrays += [w, scales, biases, bias]
        meta += [bits, group_size, 1 if mode == "mxfp4" else 0]
    return arrays, meta


def moe(
    x: mx.array,
    logits: mx.array,
    k: int,
    norm: bool,
    up: Proj,
    gate: Proj,
    down: Proj,
    activation: Any,
) -> mx.array | None:
    """A softmax-top-k sparse-MoE block after its router: per row of x (..., d), the k experts
    of highest softmax(logits) (weights renormalized over them when `norm`), their gated
    FFN, summed with those weights, as one native node: (..., d_out). None when only MLX's
    ops can run it."""
    mod = _native_float(x)
    act = activation_kind(activation)
    if mod is None or act is None or logits.dtype != mx.float32:
        return None
    projs = (gate, up, down)
    if not all(supported(p[5], p[4], p[6], p[1]) and p[0].ndim == 3 for p in projs):
        return None
    arrays, meta = _operands(projs)
    d = x.shape[-1]
    out: mx.array = mod.moe(
        x.reshape(-1, d), logits.reshape(-1, logits.shape[-1]), arrays, meta, *act, k, norm
    )
    return out.reshape(*x.shape[:-1], out.shape[-1])


_NORM_WEIGHTS = (mx.float32, mx.float16, mx.bfloat16)


def linear(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """x @ w.T (+ bias) for a float weight (rows, cols): one native node where it can run
    (MLX's reference-BLAS product of one row reads float weights at ~2 GB/s here), the same
    values to float rounding; MLX's ops otherwise."""
    mod = _native_float(x)
    if mod is not None and w.ndim == 2 and w.dtype in _NORM_WEIGHTS and x.shape[-1] == w.shape[1]:
        if bias is None or (bias.ndim == 1 and bias.dtype in _NORM_WEIGHTS):
            out: mx.array = mod.linear(x, w, bias)
            return out
    y = x @ w.T
    return y if bias is None else y + bias


def _native_float(x: mx.array) -> ModuleType | None:
    mod = module()
    return mod if mod is not None and x.dtype == mx.float32 and x.size > 0 and on_cpu() else None


def rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """`mx.fast.rms_norm(x, weight, eps)`."""
    mod = _native_float(x)
    if mod is not None and weight.ndim == 1 and weight.dtype in _NORM_WEIGHTS:
        out: mx.array = mod.rms_norm(x, weight, eps)
        return out
    return mx.fast.rms_norm(x, weight, eps)


def rope(
    x: mx.array,
    dims: int,
    *,
    traditional: bool,
    base: float | None,
    scale: float,
    offset: int | mx.array,
    freqs: mx.array | None = None,
) -> mx.array:
    """`mx.fast.rope(x, dims, ...)`: an int offset, or an array of one per batch row."""
    mod = _native_float(x)
    if mod is not None and x.ndim in (3, 4) and (freqs is None) != (base is None):
        off = offset if isinstance(offset, mx.array) else mx.array(offset, dtype=mx.int32)
        if off.dtype == mx.int32 and off.ndim <= 1 and (freqs is None or freqs.dtype == mx.float32):
            out: mx.array = mod.rope(x, off, freqs, dims, traditional, base or 0.0, scale)
            return out
    return mx.fast.rope(
        x, dims, traditional=traditional, base=base, scale=scale, offset=offset, freqs=freqs
    )


def sdpa(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    scale: float,
    mask: mx.array | str | None,
    sinks: mx.array | None = None,
) -> mx.array | None:
    """`mx.fast.scaled_dot_product_attention` with no mask, the causal one or a boolean one
    (a batch's left padding, a window), and optional per-head attention sinks (gpt-oss), in
    one native node, for a decode step's queries or a prompt chunk's; None where MLX's op
    must run (an additive mask among others)."""
    mod = _native_float(q)
    if mod is None or q.ndim != 4:
        return None
    if k.dtype != mx.float32 or v.dtype != mx.float32 or k.ndim != 4 or v.ndim != 4:
        return None
    if sinks is not None and (sinks.ndim != 1 or sinks.shape[0] != q.shape[1]):
        return None
    if sinks is not None and sinks.dtype != mx.float32:
        sinks = sinks.astype(mx.float32)  # MLX's op computes its sinks in float32 here too
    if isinstance(mask, str):
        if mask != "causal":
            return None
        out: mx.array = mod.sdpa(q, k, v, scale, True, None, sinks)
    elif mask is not None:
        if mask.dtype != mx.bool_ or mask.ndim > 4:
            return None  # an additive mask: MLX's op
        out = mod.sdpa(q, k, v, scale, False, mask, sinks)
    else:
        out = mod.sdpa(q, k, v, scale, False, None, sinks)
    return out


def gated_delta(
    qkv: mx.array,
    z: mx.array,
    b: mx.array,
    a: mx.array,
    conv_state: mx.array,
    conv_w: mx.array,
    state: mx.array,
    A_log: mx.array,  # noqa: N803 (mlx-lm's name)
    dt_bias: mx.array,
    norm_w: mx.array,
    heads: tuple[int, int, int, int],
    scales: tuple[float, float, float, float],
) -> tuple[mx.array, mx.array, mx.array] | None:
    """A Gated-DeltaNet layer between its projections, as mlx-lm's Qwen3-Next / Qwen3.5 linear
    attention computes it on the CPU, bit for bit, in one native node: the conv over the kept
    rows `conv_state` (B, K-1, C) and `qkv` (B, T, C), SiLU, the q/k L2 norms, the gates from
    `a`, `b` (B, T, Hv), the recurrence from `state` (B, Hv, Dv, Dk) and the gated RMSNorm
    with `z`. `heads`: (Hk, Dk, Hv, Dv); `scales`: q's and k's multipliers, their norm's eps,
    the gated norm's eps. Returns (y (B, T, Hv, Dv), conv state, state), or None where only
    MLX's ops can run."""
    mod = _native_float(qkv)
    if mod is None or any(t.dtype != mx.float32 for t in (z, b, a, conv_state, state)):
        return None
    y, cs, st = mod.gated_delta(
        qkv, z, b, a, conv_state, conv_w, state, A_log, dt_bias, norm_w, *heads, *scales
    )
    return y, cs, st
