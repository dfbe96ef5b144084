"""The two ops the engine calls: a quantized matmul and the routed experts' gated FFN.

Each runs the native kernel when it can (extension loaded, CPU device, float32 input, a
quantization it knows) and MLX's own op otherwise; the caller never knows which ran.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from edge0.kernels.native import module, on_cpu

GROUPS = (32, 64, 128)


def _supported(bits: int, group_size: int, mode: str, scales: mx.array) -> bool:
    if mode == "affine":
        return bits in (4, 8) and group_size in GROUPS and scales.dtype != mx.uint8
    return mode == "mxfp4" and bits == 4 and group_size == 32


def qmm(
    x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None,
    group_size: int, bits: int, mode: str = "affine",
) -> mx.array:  # fmt: skip
    """x @ dequantize(w).T, as `mx.quantized_matmul(..., transpose=True)`."""
    mod = module()
    if (
        mod is not None
        and x.dtype == mx.float32
        and w.ndim == 2
        and x.size > 0
        and _supported(bits, group_size, mode, scales)
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
    act = activation_kind(activation)
    if mod is None or act is None or h.dtype != mx.float32 or not on_cpu():
        return None
    projs = (gate, up, down)
    if not all(_supported(p[5], p[4], p[6], p[1]) and p[0].ndim == 3 for p in projs):
        return None
    d = h.shape[-1]
    lead = tuple(mx.broadcast_shapes(tuple(h.shape[:-2]), tuple(idx.shape)))
    x = mx.broadcast_to(h.reshape(*h.shape[:-2], d), (*lead, d)).reshape(-1, d)
    rows = mx.broadcast_to(idx, lead).reshape(-1).astype(mx.uint32)
    arrays: list[mx.array | None] = []
    meta: list[int] = []
    for w, scales, biases, bias, group_size, bits, mode in projs:
        arrays += [w, scales, biases, bias]
        meta += [bits, group_size, 1 if mode == "mxfp4" else 0]
    out: mx.array = mod.expert_ffn(x, rows, arrays, meta, *act)
    return out.reshape(*lead, 1, out.shape[-1])
