"""Qwen3-Next / Qwen3.5 hybrid layers as transformers builds them, on mlx-lm's classes.

`conv_activation` names each Gated DeltaNet's causal-conv activation (transformers applies
`hidden_act` there, mlx-lm hard-codes SiLU) in a plain attribute, `conv_activation`, and
swaps a subclass computing it into the layers whose activation is not SiLU (a native
Gated-DeltaNet node reads the attribute and leaves those to MLX). `layer_pattern` makes each
decoder layer linear or full attention as transformers' `layer_types` says, where mlx-lm
places full attention every n-th layer only.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk

from edge0.model.activations import ACTIVATIONS, SILU

LINEAR_ATTN, SELF_ATTN = "linear_attn", "self_attn"  # mlx-lm's names in a decoder layer


def _conv_rest(
    layer: Any, qkv: mx.array, z: mx.array, b: mx.array, a: mx.array, mask: Any, cache: Any
) -> mx.array:
    """mlx-lm's Gated DeltaNet after its projections, the conv's activation the layer's own."""
    B, S, _ = qkv.shape
    conv_state = cache[0] if cache is not None and cache[0] is not None else None
    if conv_state is None:
        conv_state = mx.zeros((B, layer.conv_kernel_size - 1, layer.conv_dim), dtype=qkv.dtype)
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    if cache is not None:
        n_keep = layer.conv_kernel_size - 1
        if cache.lengths is not None:
            ends = mx.clip(cache.lengths, 0, S)
            positions = (ends[:, None] + mx.arange(n_keep))[..., None]
            cache[0] = mx.take_along_axis(conv_input, positions, axis=1)
        else:
            cache[0] = mx.contiguous(conv_input[:, -n_keep:, :])
    conv_out = ACTIVATIONS[layer.conv_activation](layer.conv1d(conv_input))
    kd = layer.key_dim
    q, k, v = (
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [kd, 2 * kd], -1),
            (layer.num_k_heads, layer.num_k_heads, layer.num_v_heads),
            (layer.head_k_dim, layer.head_k_dim, layer.head_v_dim),
            strict=True,
        )
    )
    state = cache[1] if cache else None
    q, k = normalize_qk(q, k, inv_scale=layer.head_k_dim**-0.5, eps=1e-6)
    out, state = gated_delta_update(
        q, k, v, a, b, layer.A_log, layer.dt_bias, state, mask, use_kernel=not layer.training
    )
    if cache is not None:
        cache[1] = state
        cache.advance(S)
    out = layer.norm(out, z)
    y: mx.array = layer.out_proj(out.reshape(B, S, -1))
    return y


def _qwen3_5_call(self: Any, inputs: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    B, S, _ = inputs.shape
    z = self.in_proj_z(inputs).reshape(B, S, self.num_v_heads, self.head_v_dim)
    b, a = self.in_proj_b(inputs), self.in_proj_a(inputs)
    return _conv_rest(self, self.in_proj_qkv(inputs), z, b, a, mask, cache)


def _qwen3_next_call(self: Any, inputs: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    B, S, _ = inputs.shape
    q, k, v, z, b, a = self.fix_query_key_value_ordering(
        self.in_proj_qkvz(inputs), self.in_proj_ba(inputs)
    )
    qkv = mx.concatenate([t.reshape(B, S, -1) for t in (q, k, v)], axis=-1)
    return _conv_rest(self, qkv, z, b, a, mask, cache)


_ACTIVATED: dict[type, type] = {}


def _activated_class(cls: type) -> type:
    """`cls` (an mlx-lm Gated DeltaNet) applying its `conv_activation` to the causal conv
    (one subclass per class)."""
    if cls not in _ACTIVATED:
        call = _qwen3_next_call if hasattr(cls, "fix_query_key_value_ordering") else _qwen3_5_call
        _ACTIVATED[cls] = type(f"Activated{cls.__name__}", (cls,), {"__call__": call})
    return _ACTIVATED[cls]


def conv_activation(model: nn.Module, name: str) -> int:
    """Give every Gated DeltaNet of `model` the causal-conv activation `name` (transformers'
    `hidden_act`); returns how many compute other than mlx-lm's SiLU."""
    n = 0
    for layer in model.layers:
        if LINEAR_ATTN not in layer:
            continue
        gdn = layer[LINEAR_ATTN]
        object.__setattr__(gdn, "conv_activation", name)
        if name not in SILU:
            gdn.__class__ = _activated_class(type(gdn))
            n += 1
    return n


def layer_pattern(inner: nn.Module, args: Any, linear: list[bool]) -> None:
    """Make decoder layer i of `inner` (mlx-lm's Qwen3-Next / Qwen3.5 text model, built from
    `args`) a Gated DeltaNet where `linear[i]`, else full attention, and point the model's
    masks at the first layer of each kind. Runs before the weights load."""
    home = sys.modules[type(inner).__module__]
    names = ("GatedDeltaNet", "Attention")  # mlx-lm's qwen3_5 names; qwen3_next's are prefixed
    if hasattr(home, "Qwen3NextGatedDeltaNet"):
        names = ("Qwen3NextGatedDeltaNet", "Qwen3NextAttention")
    classes = {True: getattr(home, names[0]), False: getattr(home, names[1])}
    for layer, want in zip(inner.layers, linear, strict=True):
        if layer.is_linear == want:
            continue
        del layer[LINEAR_ATTN if layer.is_linear else SELF_ATTN]
        layer[LINEAR_ATTN if want else SELF_ATTN] = classes[want](args)
        layer.is_linear = want
    inner.ssm_idx = next((i for i, lin in enumerate(linear) if lin), None)
    inner.fa_idx = next((i for i, lin in enumerate(linear) if not lin), None)
