"""Llama-4's layer patterns as transformers builds them, on mlx-lm's llama4 classes.

mlx-lm's llama4 hard-codes them: NoPE (and global attention) on every 4th layer, MoE on
every `interleave_moe_layer_step`-th, the chunk mask and its caches by the same rule (so
at least 4 layers). `layer_pattern` rebuilds each layer's attention and feed-forward as
`no_rope_layers` and `moe_layers` say, and swaps in subclasses of the `layer_types`
chunked_attention layers (each trims its cache to its chunk and builds its chunk mask, so a
layer run alone, as one rank runs its own, attends as in the whole model), of the text
model (global attention on the others) and of the model (their caches: a chunked layer's
keeps its chunk, mlx-lm's ChunkedKVCache).
`top_k_class` routes more than mlx-lm's one expert, `qk_norm_class` norms q/k with the
config's eps.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import ChunkedKVCache, KVCache

CHUNKED = "chunked_attention"
# a layer index mlx-lm's llama4 Attention builds with and without rope ((i + 1) % 4 != 0)
ROPE_INDEX, NOPE_INDEX = 0, 3


def layer_pattern(
    model: nn.Module, rope: Sequence[bool], moe: Sequence[bool], chunked: Sequence[bool]
) -> None:
    """Make layer i of mlx-lm's llama4 `model` rotate where `rope[i]`, route experts where
    `moe[i]` (else the dense MLP) and attend within chunks where `chunked[i]` (else over
    the whole context). Runs before the weights load."""
    from mlx_lm.models import llama4

    text = model.language_model
    inner, args = text.model, text.args
    for i, layer in enumerate(inner.layers):
        if bool(layer.self_attn.use_rope) != rope[i]:
            layer.self_attn = llama4.Attention(args, ROPE_INDEX if rope[i] else NOPE_INDEX)
        if layer.is_moe_layer != moe[i]:
            layer.feed_forward = (
                llama4.MoE(args) if moe[i] else llama4.MLP(args, args.intermediate_size_mlp)
            )
            layer.is_moe_layer = moe[i]
        if chunked[i]:
            layer.__class__ = _chunked_class(layer.__class__)
            object.__setattr__(layer, "edge0_chunk", int(inner.attention_chunk_size))
    object.__setattr__(inner, "edge0_chunked", tuple(chunked))
    inner.__class__ = _text_class(inner.__class__)
    model.__class__ = _caching_class(type(model))


def _chunk_mask(size: int, h: mx.array, cache: Any) -> mx.array:
    """A chunked layer's mask over `h`: each query sees the keys of its own chunk up to
    itself (the cache, trimmed, starts at `start_position`)."""
    offset = cache.offset if cache is not None else 0
    start = cache.start_position if cache is not None else 0
    end = offset + h.shape[1]
    keys, queries = mx.arange(start, end), mx.arange(offset, end)[:, None]
    return ((keys // size) == (queries // size)) & (keys <= queries)


@functools.cache
def _chunked_class(cls: type) -> type:
    """`cls` (mlx-lm's llama4 TransformerBlock) attending within its chunk whatever mask it
    is handed: it drops from its cache the keys no later query of the chunk sees, then
    masks by chunk."""

    def __call__(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if cache is not None:
            cache.maybe_trim_front()
        out: mx.array = cls.__call__(self, x, _chunk_mask(self.edge0_chunk, x, cache), cache)
        return out

    return type(f"Chunked{cls.__name__}", (cls,), {"__call__": __call__})


@functools.cache
def _text_class(cls: type) -> type:
    """`cls` (mlx-lm's llama4 LlamaModel) with global attention on its unchunked layers
    (its chunked layers mask themselves)."""

    def __call__(self: Any, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        h = self.embed_tokens(inputs)
        chunked: tuple[bool, ...] = self.edge0_chunked
        full = next((i for i, c in enumerate(chunked) if not c), None)
        global_mask = None
        if full is not None:
            global_mask = create_attention_mask(h, cache[full] if cache is not None else None)
        caches = cache if cache is not None else [None] * len(self.layers)
        for layer, c, kind in zip(self.layers, caches, chunked, strict=True):
            h = layer(h, None if kind else global_mask, cache=c)
        out: mx.array = self.norm(h)
        return out

    return type(f"Patterned{cls.__name__}", (cls,), {"__call__": __call__})


@functools.cache
def _caching_class(cls: type) -> type:
    """`cls` (mlx-lm's llama4 Model) whose chunked layers' caches keep their chunk only."""

    def make_cache(self: Any) -> list[Any]:
        inner = self.language_model.model
        size = inner.attention_chunk_size
        return [ChunkedKVCache(size) if c else KVCache() for c in inner.edge0_chunked]

    return type(f"Patterned{cls.__name__}", (cls,), {"make_cache": make_cache})


@functools.cache
def top_k_class() -> type:
    """mlx-lm's llama4 MoE routing top-k: expert j runs on x * sigmoid(logit_j) (transformers'
    Llama4TextMoe, whose other experts see zeros and add nothing)."""
    from mlx_lm.models.llama4 import MoE

    def __call__(self: Any, x: mx.array) -> mx.array:
        logits = self.router(x)
        k = self.top_k
        inds = mx.stop_gradient(mx.argpartition(-logits, kth=k - 1, axis=-1)[..., :k])
        gates = mx.take_along_axis(logits, inds, axis=-1)
        gates = mx.sigmoid(gates.astype(mx.float32)).astype(x.dtype)  # (..., k)
        out = self.shared_expert(x)
        for j in range(k):
            out = out + self.experts(x * gates[..., j : j + 1], inds[..., j : j + 1]).squeeze(-2)
        return out

    return type("TopKMoE", (MoE,), {"__call__": __call__})


@functools.cache
def qk_norm_class() -> type:
    """mlx-lm's llama4 attention on a RoPE layer, q/k normalised with the config's eps."""
    from mlx_lm.models.base import scaled_dot_product_attention
    from mlx_lm.models.llama4 import Attention

    def __call__(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        b, t, _ = x.shape
        offset = cache.offset if cache is not None else 0

        def heads(proj: Any, n: int) -> mx.array:
            return proj(x).reshape(b, t, n, -1).transpose(0, 2, 1, 3)

        q = mx.fast.rms_norm(
            self.rope(heads(self.q_proj, self.n_heads), offset=offset), None, self.qk_eps
        )
        k = mx.fast.rms_norm(
            self.rope(heads(self.k_proj, self.n_kv_heads), offset=offset), None, self.qk_eps
        )
        v = heads(self.v_proj, self.n_kv_heads)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, t, -1))

    return type("QkEpsAttention", (Attention,), {"__call__": __call__})
