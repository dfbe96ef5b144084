"""Makes a loaded model's layers call the native kernels (edge0.kernels.ops).

`use_native(model)` changes the class of each `nn.QuantizedLinear`, `nn.QuantizedEmbedding`
(its `as_linear`, tied output heads), mlx-lm `SwitchGLU` over quantized experts, mlx-lm's
Qwen3-MoE sparse block (`moe`: routing, experts and weighted sum in one node),
`nn.RMSNorm` and `nn.RoPE` to a subclass whose call goes through `qmm` / `expert_ffn` /
`rms_norm` / `rope`. Attention has no layer of its own in mlx-lm: each model module calls
the function `scaled_dot_product_attention` it imported from `mlx_lm.models.base`, so
`use_native` points that name, in the modules of the model's own classes, at
`native_attention`, which runs the native op where it can and mlx-lm's function otherwise.
Parameters, names and isinstance checks are unchanged; each call still falls back to MLX's
op where the native one cannot run, so a model changed here runs on every device.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base as mlx_lm_base
from mlx_lm.models.qwen3_moe import Qwen3MoeSparseMoeBlock
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU

from edge0.kernels.ops import Proj, expert_ffn, moe, qmm, rms_norm, rope, sdpa

_MLX_LM_ATTENTION = mlx_lm_base.scaled_dot_product_attention


class NativeQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear whose product runs `qmm`."""

    def __call__(self, x: mx.array) -> mx.array:
        y = qmm(
            x,
            self["weight"],
            self["scales"],
            self.get("biases"),
            self.group_size,
            self.bits,
            self.mode,
        )
        return y + self["bias"] if "bias" in self else y


class NativeQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding whose `as_linear` (a tied output head) runs `qmm`."""

    def as_linear(self, x: mx.array) -> mx.array:
        return qmm(
            x,
            self["weight"],
            self["scales"],
            self.get("biases"),
            self.group_size,
            self.bits,
            self.mode,
        )


def _proj(layer: Any) -> Proj:
    return (
        layer["weight"],
        layer["scales"],
        layer.get("biases"),
        layer.get("bias"),
        layer.group_size,
        layer.bits,
        layer.mode,
    )


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


class NativeQwen3MoeBlock(Qwen3MoeSparseMoeBlock):
    """mlx-lm's Qwen3-MoE sparse block whose routing, experts and weighted sum (after the
    router projection) are one `moe` node."""

    def __call__(self, x: mx.array) -> mx.array:
        experts = self.switch_mlp
        projs = (experts.up_proj, experts.gate_proj, experts.down_proj)
        if self.sharding_group is None and all(isinstance(p, QuantizedSwitchLinear) for p in projs):
            up, gate, down = (_proj(p) for p in projs)
            out = moe(
                x,
                self.gate(x),
                self.top_k,
                bool(self.norm_topk_prob),
                up,
                gate,
                down,
                experts.activation,
            )
            if out is not None:
                return out
        return super().__call__(x)


class NativeRMSNorm(nn.RMSNorm):
    """nn.RMSNorm as one native node (MLX's CPU result bit for bit)."""

    def __call__(self, x: mx.array) -> mx.array:
        return rms_norm(x, self["weight"], self.eps)


class NativeRoPE(nn.RoPE):
    """nn.RoPE as one native node (MLX's CPU result bit for bit)."""

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        return rope(
            x,
            self.dims,
            traditional=self.traditional,
            base=self.base,
            scale=self.scale,
            offset=offset,
        )


_SWAPS: tuple[tuple[type, type], ...] = (
    (nn.QuantizedLinear, NativeQuantizedLinear),
    (nn.QuantizedEmbedding, NativeQuantizedEmbedding),
    (SwitchGLU, NativeSwitchGLU),
    (Qwen3MoeSparseMoeBlock, NativeQwen3MoeBlock),
    (nn.RMSNorm, NativeRMSNorm),
    (nn.RoPE, NativeRoPE),
)


def native_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    cache: Any,
    scale: float,
    mask: mx.array | str | None,
    sinks: mx.array | None = None,
) -> mx.array:
    """mlx-lm's `scaled_dot_product_attention`, as one native node where it can run."""
    if not hasattr(cache, "bits"):  # not a quantized KV cache
        out = sdpa(queries, keys, values, scale=scale, mask=mask, sinks=sinks)
        if out is not None:
            return out
    return _MLX_LM_ATTENTION(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)  # type: ignore[arg-type]


def use_native(model: nn.Module) -> int:
    """Route `model`'s quantized layers, norms, rotary embeddings and attention through the
    native kernels (in place).

    Returns how many layers changed class.
    """
    changed = 0
    for _, module in model.named_modules():
        for base, native in _SWAPS:
            if type(module) is base:
                module.__class__ = native
                changed += 1
        home = sys.modules.get(type(module).__module__)
        if getattr(home, "scaled_dot_product_attention", None) is _MLX_LM_ATTENTION:
            home.scaled_dot_product_attention = native_attention  # type: ignore[union-attr]
    return changed
