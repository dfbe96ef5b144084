"""Resident int4 linears over a prompt chunk without the native kernels: one dequantize, one matmul
(docs/runtime.md, "Prompt processing", compute of a chunk).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeGuard

import mlx.core as mx
import mlx.nn as nn

from edge0.kernels.native import module
from edge0.kernels.ops import supported

DENSE_ROWS = 32  # input rows from which a chunk's linear dequantizes (below: the int4 kernel)
DENSE_MAX_BYTES = 64 << 20  # a linear whose fp32 weight is larger keeps the int4 kernel


class DenseChunkLinear(nn.Module):
    """A quantized linear that, from `rows` input rows on, dequantizes and runs one matmul."""

    def __init__(self, inner: nn.QuantizedLinear, rows: int) -> None:
        super().__init__()
        self.inner = inner
        self.rows = rows

    def __call__(self, x: mx.array) -> mx.array:
        q = self.inner
        if x.size // max(1, x.shape[-1]) < self.rows:
            return q(x)
        biases = q.get("biases")
        w = mx.dequantize(
            q["weight"],
            q["scales"].astype(x.dtype),
            None if biases is None else biases.astype(x.dtype),
            group_size=q.group_size,
            bits=q.bits,
            mode=q.mode,
        )
        y = x @ w.T  # (..., out): w is (out, in)
        bias = q.get("bias")
        return y if bias is None else y + bias


def on_cpu() -> bool:
    """The dense paths are for the CPU backend's int4 kernels (Metal/CUDA keep theirs)."""
    return bool(mx.default_device().type == mx.DeviceType.cpu)


def _dense_ok(m: Any) -> TypeGuard[nn.QuantizedLinear]:
    """An affine-quantized linear whose fp32 weight fits DENSE_MAX_BYTES and that the native
    kernels do not run (they are faster than the dequantized matmul at every row count)."""
    if not isinstance(m, nn.QuantizedLinear) or getattr(m, "mode", "affine") != "affine":
        return False
    if module() is not None and supported(m.bits, m.group_size, m.mode, m["scales"]):
        return False
    out, packed = m["weight"].shape[-2:]
    return bool(out * packed * (32 // m.bits) * 4 <= DENSE_MAX_BYTES)


@contextlib.contextmanager
def dense_linears(model: nn.Module, rows: int | None = None) -> Iterator[int]:
    """Meanwhile, every affine int4/int8 `nn.QuantizedLinear` of `model` runs inputs of at
    least `rows` (DENSE_ROWS on the CPU backend, else none) rows dense; yields how many were
    swapped. `rows` 0: none."""
    rows = (DENSE_ROWS if on_cpu() else 0) if rows is None else rows
    swapped: list[tuple[Any, Any, nn.QuantizedLinear]] = []  # (holder, key, linear)
    if rows > 0:
        for _, parent in model.named_modules():
            for key, child in list(parent.items()):
                if _dense_ok(child):
                    swapped.append((parent, key, child))
                elif isinstance(child, list):  # e.g. nn.Sequential's layers
                    swapped += [(child, i, c) for i, c in enumerate(child) if _dense_ok(c)]
    for holder, key, child in swapped:
        holder[key] = DenseChunkLinear(child, rows)
    try:
        yield len(swapped)
    finally:
        for holder, key, child in swapped:
            holder[key] = child


def dense_weight_bytes(config: dict[str, Any]) -> int:
    """The largest resident projection as fp32 (what a dense chunk linear holds), x 2 (the
    evaluation can hold two at once): the Gated DeltaNet's q/k/v projection, attention's
    gated q, the shared expert (a larger one keeps the int4 kernel: DENSE_MAX_BYTES)."""
    c: dict[str, Any] = config.get("text_config") or config
    d = int(c.get("hidden_size", 0))
    heads = int(c.get("num_attention_heads", 0) or 0)
    head_dim = int(c.get("head_dim", 0) or (d // heads if heads else 0))
    key = int(c.get("linear_num_key_heads", 0) or 0) * int(c.get("linear_key_head_dim", 0) or 0)
    value = int(c.get("linear_num_value_heads", 0) or 0) * int(
        c.get("linear_value_head_dim", 0) or 0
    )
    shared = int(c.get("shared_expert_intermediate_size", 0) or 0)
    widest = max(2 * heads * head_dim, 2 * key + value, shared, d)
    return 2 * min(widest * d * 4, DENSE_MAX_BYTES)
