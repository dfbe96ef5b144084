"""Makes a loaded model's layers call the native kernels (edge0.kernels.ops).

`use_native(model)` changes the class of each `nn.QuantizedLinear`, `nn.Linear` (float
weights), `nn.QuantizedEmbedding` (its `as_linear`, tied output heads), mlx-lm `SwitchGLU`
over quantized experts, mlx-lm's Qwen3-MoE sparse block (`moe`: routing, experts and weighted
sum in one node), mlx-lm's Qwen3-MoE attention (a one-token step without transposes),
`nn.RMSNorm`, `nn.RoPE` and the Qwen3-Next / Qwen3.5 Gated-DeltaNet to a
subclass whose call goes through `qmm` / `linear` / `expert_ffn` / `moe` / `rms_norm` / `rope`
/ `gated_delta`. Attention has no
layer of its own in mlx-lm: each model module calls the function
`scaled_dot_product_attention` it imported from `mlx_lm.models.base`, so
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
import numpy as np
from mlx_lm.models import base as mlx_lm_base
from mlx_lm.models import qwen3_moe
from mlx_lm.models.qwen3_5 import GatedDeltaNet
from mlx_lm.models.qwen3_moe import Qwen3MoeSparseMoeBlock
from mlx_lm.models.qwen3_next import Qwen3NextGatedDeltaNet, Qwen3NextRMSNormGated
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU

from edge0.kernels import native
from edge0.kernels.ops import (
    Proj,
    expert_ffn,
    expert_ffn_runs,
    gated_delta,
    linear,
    moe,
    qmm,
    rms_norm,
    rope,
    sdpa,
)

_MLX_LM_ATTENTION = mlx_lm_base.scaled_dot_product_attention
_SILU = ("silu", "swish")  # a Gated-DeltaNet's `conv_activation` names the node computes


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


class NativeLinear(nn.Linear):
    """nn.Linear (float weights) whose product runs `linear`."""

    def __call__(self, x: mx.array) -> mx.array:
        return linear(x, self["weight"], self.get("bias"))


class NativeQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding whose `as_linear` (a tied output head) runs `qmm`, and whose
    lookup of a few host-made token ids (a decode step's) dequantizes their rows on the host:
    MLX's CPU `dequantize` of gathered rows is ~45 graph nodes, the same arithmetic in numpy
    (`q * scale`, then `+ bias`, each rounded to float32) is none."""

    def __call__(self, x: mx.array) -> mx.array:
        rows = host_rows(self, x)
        return super().__call__(x) if rows is None else rows

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


HOST_ROWS = 16  # at most this many ids are looked up on the host (a decode step's, a batch's)


def host_rows(emb: nn.QuantizedEmbedding, x: mx.array) -> mx.array | None:
    """`emb(x)` dequantized on the host, for a few ids on the CPU with affine 4/8-bit float32
    scales and biases (what `mx.dequantize` computes there, value for value); None otherwise.
    `x` is read on the host: the engine's ids are made there, never a lazy graph's."""
    scales, biases = emb["scales"], emb.get("biases")
    if (
        x.size > HOST_ROWS
        or emb.mode != "affine"
        or emb.bits not in (4, 8)
        or biases is None
        or scales.dtype != mx.float32
        or biases.dtype != mx.float32
        or x.dtype not in (mx.int32, mx.uint32, mx.int64, mx.uint64)
        or not native.on_cpu()
    ):
        return None
    ids = np.asarray(x).reshape(-1)
    packed = np.asarray(emb["weight"])[ids]  # (n, dims * bits / 32) uint32
    per = 32 // emb.bits
    shifts = np.arange(per, dtype=np.uint32) * emb.bits
    q = (packed[..., None] >> shifts) & np.uint32((1 << emb.bits) - 1)  # low bits first
    q = q.reshape(len(ids), -1).astype(np.float32)  # (n, dims)
    g = emb.group_size
    s = np.repeat(np.asarray(scales)[ids], g, axis=-1)
    b = np.repeat(np.asarray(biases)[ids], g, axis=-1)
    out = q * s
    out += b
    return mx.array(out.reshape(*x.shape, -1))


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


def native_experts(switch: nn.Module | None) -> bool:
    """Whether an mlx-lm SwitchGLU (swapped by `use_native` or still to be) runs its quantized
    experts as the native `expert_ffn` here: each row's slot is read with its scales and biases
    in their stored dtype, so a narrow stack is never widened whole per call (MLX's
    `gather_qmm` widens it)."""
    if type(switch) not in (SwitchGLU, NativeSwitchGLU):
        return False
    projs = (switch.up_proj, switch.gate_proj, switch.down_proj)  # type: ignore[union-attr]
    if not all(type(p) is QuantizedSwitchLinear for p in projs):
        return False
    up, gate, down = (_proj(p) for p in projs)
    return expert_ffn_runs(up, gate, down, switch.activation)  # type: ignore[union-attr]


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


def _gdn_runs(layer: Any, x: mx.array, mask: Any, cache: Any) -> bool:
    """Whether a Gated-DeltaNet call runs the native op: no padding mask, no per-row lengths,
    no tensor sharding, not training, float32 on the CPU with the kernels loaded, and the
    layer's own conv with SiLU and gated norm (the node computes them: another activation,
    or a module put in their place, a wrapper or another norm, runs in mlx-lm's path)."""
    return (
        mask is None
        and getattr(layer, "conv_activation", "silu") in _SILU  # edge0.model.hybrid sets it
        and type(layer.conv1d) is nn.Conv1d
        and type(layer.norm) is Qwen3NextRMSNormGated
        and getattr(layer, "sharding_group", None) is None
        and not layer.training
        and getattr(cache, "lengths", None) is None
        and x.dtype == mx.float32
        and native.module() is not None
        and native.on_cpu()
    )


def _gdn_rest(layer: Any, qkv: mx.array, z: mx.array, b: mx.array, a: mx.array, cache: Any) -> Any:
    """Everything between the projections (edge0.kernels.ops.gated_delta), the caches
    updated as mlx-lm does; None where the native op cannot run."""
    B, S = qkv.shape[:2]
    K, hv, dv = layer.conv_kernel_size, layer.num_v_heads, layer.head_v_dim
    conv_state = cache[0] if cache is not None else None
    if conv_state is None:
        conv_state = mx.zeros((B, K - 1, layer.conv_dim), dtype=qkv.dtype)
    state = cache[1] if cache is not None else None
    if state is None:
        state = mx.zeros((B, hv, dv, layer.head_k_dim), dtype=mx.float32)
    inv = layer.head_k_dim**-0.5  # normalize_qk's readout scale and eps, as mlx-lm computes them
    got = gated_delta(
        qkv,
        z,
        b,
        a,
        conv_state,
        layer.conv1d.weight,
        state,
        layer.A_log,
        layer.dt_bias,
        layer.norm.weight,
        (layer.num_k_heads, layer.head_k_dim, hv, dv),
        (inv**2, inv, 1e-6 * inv**2, layer.norm.eps),
    )
    if got is None:
        return None
    y, conv_state, state = got
    if cache is not None:
        cache[0], cache[1] = conv_state, state
        cache.advance(S)
    return y.reshape(B, S, -1)


class NativeGatedDeltaNet(GatedDeltaNet):
    """mlx-lm's Qwen3.5 Gated-DeltaNet whose conv, gates, recurrence and gated norm are one
    native node (its projections stay modules: LoRA and chunked prompts wrap them)."""

    def __call__(self, inputs: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if not _gdn_runs(self, inputs, mask, cache):
            return super().__call__(inputs, mask, cache)
        B, S, _ = inputs.shape
        z = self.in_proj_z(inputs).reshape(B, S, self.num_v_heads, self.head_v_dim)
        y = _gdn_rest(
            self, self.in_proj_qkv(inputs), z, self.in_proj_b(inputs), self.in_proj_a(inputs), cache
        )
        assert y is not None  # _gdn_runs checked what gated_delta needs
        return self.out_proj(y)


class NativeQwen3NextGatedDeltaNet(Qwen3NextGatedDeltaNet):
    """mlx-lm's Qwen3-Next Gated-DeltaNet, the same way (after its fused projections'
    per-head reordering)."""

    def __call__(self, inputs: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if not _gdn_runs(self, inputs, mask, cache):
            return super().__call__(inputs, mask, cache)
        B, S, _ = inputs.shape
        q, k, v, z, b, a = self.fix_query_key_value_ordering(
            self.in_proj_qkvz(inputs), self.in_proj_ba(inputs)
        )
        qkv = mx.concatenate(
            [q.reshape(B, S, -1), k.reshape(B, S, -1), v.reshape(B, S, -1)], axis=-1
        )
        y = _gdn_rest(self, qkv, z, b, a, cache)
        assert y is not None
        return self.out_proj(y)


class OneTokenQwen3MoeAttention(qwen3_moe.Attention):
    """mlx-lm's Qwen3-MoE attention; a one-token step lays its queries, keys and values out as
    (B, heads, 1, head_dim) by a reshape alone and its output back the same way: with one
    position the transposes move no value, so the same values in 4 fewer graph nodes a layer
    (and the norms and the rope read contiguous rows)."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        B, L, _ = x.shape
        if L != 1 or cache is None:
            return super().__call__(x, mask, cache)
        q = self.q_norm(self.q_proj(x).reshape(B, self.n_heads, 1, -1))
        k = self.k_norm(self.k_proj(x).reshape(B, self.n_kv_heads, 1, -1))
        v = self.v_proj(x).reshape(B, self.n_kv_heads, 1, -1)
        q = self.rope(q, offset=cache.offset)
        k = self.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = native_attention(q, k, v, cache, self.scale, mask)  # (B, heads, 1, head_dim)
        return self.o_proj(out.reshape(B, 1, -1))


_SWAPS: tuple[tuple[type, type], ...] = (
    (nn.QuantizedLinear, NativeQuantizedLinear),
    (nn.QuantizedEmbedding, NativeQuantizedEmbedding),
    (nn.Linear, NativeLinear),
    (SwitchGLU, NativeSwitchGLU),
    (Qwen3MoeSparseMoeBlock, NativeQwen3MoeBlock),
    (qwen3_moe.Attention, OneTokenQwen3MoeAttention),
    (nn.RMSNorm, NativeRMSNorm),
    (nn.RoPE, NativeRoPE),
    (GatedDeltaNet, NativeGatedDeltaNet),
    (Qwen3NextGatedDeltaNet, NativeQwen3NextGatedDeltaNet),
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
        for base, swap in _SWAPS:
            if type(module) is base:
                module.__class__ = swap
                changed += 1
        home = sys.modules.get(type(module).__module__)
        if getattr(home, "scaled_dot_product_attention", None) is _MLX_LM_ATTENTION:
            home.scaled_dot_product_attention = native_attention  # type: ignore[union-attr]
    return changed
