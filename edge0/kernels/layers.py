"""Makes a loaded model's quantized layers call the native kernels (edge0.kernels.ops).

`use_native(model)` changes the class of each `nn.QuantizedLinear`, `nn.QuantizedEmbedding`
(its `as_linear`, tied output heads) and mlx-lm `SwitchGLU` over quantized experts to a
subclass whose call goes through `qmm` / `expert_ffn`. Parameters, names and isinstance
checks are unchanged; each call still falls back to MLX's op where the native one
cannot run, so a model changed here runs on every device.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU

from edge0.kernels.ops import Proj, expert_ffn, qmm


class NativeQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear whose product runs `qmm`."""

    def __call__(self, x: mx.array) -> mx.array:
        y = qmm(x, self["weight"], self["scales"], self.get("biases"), self.group_size,
                self.bits, self.mode)  # fmt: skip
        return y + self["bias"] if "bias" in self else y


class NativeQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding whose `as_linear` (a tied output head) runs `qmm`."""

    def as_linear(self, x: mx.array) -> mx.array:
        return qmm(x, self["weight"], self["scales"], self.get("biases"), self.group_size,
                   self.bits, self.mode)  # fmt: skip


def _proj(layer: Any) -> Proj:
    return (layer["weight"], layer["scales"], layer.get("biases"), layer.get("bias"),
            layer.group_size, layer.bits, layer.mode)  # fmt: skip


class NativeSwitchGLU(SwitchGLU):
    """mlx-lm's SwitchGLU whose quantized experts run as one `expert_ffn` op."""

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        projs = (self.up_proj, self.gate_proj, self.down_proj)
        if all(isinstance(p, QuantizedSwitchLinear) for p in projs):
            h = mx.expand_dims(x, (-2, -3))  # (..., 1, 1, d) against indices (..., K)
            up, gate, down = (_proj(p) for p in projs)
            out = expert_ffn(h, mx.stop_gradient(indices), up, gate, down, self.activation)
            if out is not None:
                return out.squeeze(-2)  # (..., K, d)
        return super().__call__(x, indices)


_SWAPS: tuple[tuple[type, type], ...] = (
    (nn.QuantizedLinear, NativeQuantizedLinear),
    (nn.QuantizedEmbedding, NativeQuantizedEmbedding),
    (SwitchGLU, NativeSwitchGLU),
)


def use_native(model: nn.Module) -> int:
    """Route `model`'s quantized layers through the native kernels (in place).

    Returns how many layers changed class.
    """
    changed = 0
    for _, module in model.named_modules():
        for base, native in _SWAPS:
            if type(module) is base:
                module.__class__ = native
                changed += 1
    return changed
