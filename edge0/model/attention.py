"""Attention features transformers computes and an mlx-lm class lacks, added to a built model.

Each is a replaced module or a subclass swapped in (as edge0.kernels.layers does), never a
copy of mlx-lm's code: `projections` rebuilds q/k/v/o with the config's biases and head
size before the weights load; `windowed` gives each attention its own mask from its own
cache (a sliding window, or the whole context) and the model caches that keep a window's
tokens only (mlx-lm's `RotatingKVCache`); `tie` makes the output head the embedding.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def projections(
    attn: nn.Module, bias: dict[str, bool], heads: dict[str, int] | None = None
) -> None:
    """Rebuild `attn`'s projections named in `bias` as float linears with (True) or without
    bias; `heads` (q_proj: heads x head_dim, ...) gives their head-side widths anew."""
    for name, with_bias in bias.items():
        old = attn[name]
        out_dim, in_dim = old.weight.shape
        if heads and name in heads:
            out_dim, in_dim = (in_dim, heads[name]) if name == "o_proj" else (heads[name], in_dim)
        attn[name] = nn.Linear(in_dim, out_dim, bias=with_bias)


def resize_heads(attn: nn.Module, head_dim: int, heads: int, kv_heads: int) -> None:
    """Size `attn` (an mlx-lm attention reshaping by its heads) for an explicit head_dim:
    its float projections, softmax scale and plain rope."""
    widths = {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim}
    widths |= {"v_proj": kv_heads * head_dim, "o_proj": heads * head_dim}
    projections(attn, {p: "bias" in attn[p] for p in widths}, widths)
    attn.scale = head_dim**-0.5
    attn.rope = nn.RoPE(head_dim, traditional=attn.rope.traditional, base=attn.rope.base)


@functools.cache
def _windowed_class(cls: type) -> type:
    """`cls` (an mlx-lm attention) masking by its own cache and window (None: the context)."""

    def __call__(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> Any:
        mask = create_attention_mask(x, cache, window_size=self.edge0_window)
        return cls.__call__(self, x, mask, cache)

    return type(f"Windowed{cls.__name__}", (cls,), {"__call__": __call__})


@functools.cache
def _caching_class(cls: type) -> type:
    """`cls` (an mlx-lm Model) whose caches keep a windowed layer's last tokens only."""

    def make_cache(self: Any) -> list[Any]:
        return [RotatingKVCache(max_size=w) if w else KVCache() for w in self.edge0_windows]

    return type(f"Windowed{cls.__name__}", (cls,), {"make_cache": make_cache})


def windowed(
    model: nn.Module, windows: Sequence[int | None], attention: Sequence[nn.Module]
) -> None:
    """Give each layer's `attention` its sliding window (None: the whole context): its own
    mask, and a cache that keeps the window's tokens (what transformers attends over)."""
    for attn, window in zip(attention, windows, strict=True):
        attn.__class__ = _windowed_class(type(attn))
        object.__setattr__(attn, "edge0_window", window)
    model.__class__ = _caching_class(type(model))
    object.__setattr__(model, "edge0_windows", tuple(windows))


class TiedHead:
    """The output head as the input embedding's transpose (not a module: nothing to load)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, x: mx.array) -> mx.array:
        out: mx.array = self.model.model.embed_tokens.as_linear(x)
        return out


def tie(model: nn.Module) -> None:
    """Make the output head the embedding (transformers' `tie_word_embeddings`) where the
    mlx-lm class built one anyway (on the model, or its language model): its parameters go."""
    for _, holder in model.named_modules():
        if "lm_head" in holder and isinstance(holder["lm_head"], nn.Module):
            del holder["lm_head"]
            object.__setattr__(holder, "lm_head", TiedHead(holder))
