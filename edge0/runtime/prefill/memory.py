"""What a prompt chunk holds in memory, and the sub-chunked recurrence that bounds it
(docs/runtime.md, "Prompt processing", memory of a chunk).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from edge0.runtime.prefill.dense import dense_weight_bytes

SUB_TOKENS = 16  # tokens per evaluated piece of a recurrent layer (prefill.md: 16 MiB/state)
LINEAR_ATTN = "linear_attn"  # mlx-lm's name of the Gated DeltaNet in a decoder layer


def _text(config: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = config.get("text_config") or config
    return c


def recurrent_state_bytes(config: dict[str, Any]) -> int:
    """One linear-attention layer's delta-rule state (value heads x Dv x Dk fp32), 0 if none."""
    c = _text(config)
    if not c.get("linear_num_value_heads"):
        return 0
    return (
        int(c["linear_num_value_heads"])
        * int(c.get("linear_value_head_dim", 0))
        * int(c.get("linear_key_head_dim", 0))
        * 4
    )


def chunk_fixed_bytes(config: dict[str, Any]) -> int:
    """What a chunk holds whatever its length: the states of one evaluated recurrent piece
    and the dequantized weights of the dense chunk linears (prefill.dense)."""
    return (SUB_TOKENS + 2) * recurrent_state_bytes(config) + dense_weight_bytes(config)


def chunk_bytes_per_token(config: dict[str, Any], top_k: int, context: int) -> int:
    """MLX memory a prompt chunk holds per token at its peak (an estimate from the config).

    The residual stream and layer activations (~16 x d fp32), the (token, k) expert
    pair inputs and outputs (3 x K x d), a recurrent layer's projections (q, k, v,
    z, conv: ~3 x its value width) and the attention scores and weights of one
    layer over the planned context (2 x heads x context).
    """
    c = _text(config)
    d = int(c.get("hidden_size", 0))
    heads = int(c.get("num_attention_heads", 1) or 1)
    value = int(c.get("linear_num_value_heads", 0) or 0) * int(c.get("linear_value_head_dim", 0))
    return (16 * d + 3 * top_k * d + 3 * value + 2 * heads * context) * 4


class _Slices(nn.Module):
    """Stands in for an input projection: returns rows `at` of its output over the whole chunk."""

    def __init__(self, full: mx.array) -> None:
        super().__init__()
        self.full = full
        self.at = (0, 0)

    def __call__(self, x: mx.array) -> mx.array:
        a, b = self.at
        assert x.shape[1] == b - a, "a piece's projection input is the piece"
        return self.full[:, a:b]


class _Deferred(nn.Module):
    """Stands in for the output projection: the pieces' outputs are projected once, together."""

    def __call__(self, x: mx.array) -> mx.array:
        return x


class _Pieces(nn.Module):
    """A recurrent layer run `size` tokens at a time, each piece and its cache evaluated.

    Its input projections (`in_proj_*`) run once over the whole chunk and its output
    projection once over the pieces' outputs (both are per-token linears: the same
    values), so a dense chunk linear (prefill.dense) dequantizes each weight once a chunk.
    """

    def __init__(
        self, inner: nn.Module, size: int, check: Callable[[], None] | None = None
    ) -> None:
        super().__init__()
        self.inner = inner
        self.size = size
        self.check = check  # called before each piece (a cancelled prompt stops there)

    def __call__(self, x: mx.array, mask: mx.array | None = None, cache: Any = None) -> mx.array:
        n, inner = x.shape[1], self.inner
        if n <= self.size or cache is None:
            return inner(x, mask, cache)
        names = [
            k for k, v in inner.items() if k.startswith("in_proj") and isinstance(v, nn.Module)
        ]
        full = {k: inner[k](x) for k in names}
        mx.eval(list(full.values()))
        kept = {k: inner[k] for k in [*names, "out_proj"] if isinstance(inner.get(k), nn.Module)}
        stand = {k: _Slices(v) for k, v in full.items()}
        outs = []
        try:
            for k, v in stand.items():
                setattr(inner, k, v)
            if "out_proj" in kept:
                inner.out_proj = _Deferred()
            for a in range(0, n, self.size):
                if self.check is not None:
                    self.check()
                for v in stand.values():
                    v.at = (a, min(n, a + self.size))
                piece_mask = None if mask is None else mask[:, a : a + self.size]
                out = inner(x[:, a : a + self.size], piece_mask, cache)
                mx.eval(out, [s for s in cache.cache if s is not None])  # free the piece's states
                outs.append(out)
        finally:
            for k, v in kept.items():
                setattr(inner, k, v)
        y = mx.concatenate(outs, axis=1)  # (B, T, value width) before the output projection
        return kept["out_proj"](y) if "out_proj" in kept else y


@contextlib.contextmanager
def bounded_recurrence(
    model: nn.Module, size: int | None = None, check: Callable[[], None] | None = None
) -> Iterator[None]:
    """Run every decoder layer's `linear_attn` `size` (SUB_TOKENS) tokens at a time meanwhile,
    calling `check` before each piece.

    `size` 0 leaves the layers as they are (the unbounded path, for measurements).
    """
    size = SUB_TOKENS if size is None else size
    layers = list(getattr(model, "layers", [])) if size > 0 else []
    swapped = [
        (layer, getattr(layer, LINEAR_ATTN))
        for layer in layers
        if isinstance(getattr(layer, LINEAR_ATTN, None), nn.Module)
    ]
    for layer, inner in swapped:
        setattr(layer, LINEAR_ATTN, _Pieces(inner, size, check))
    try:
        yield
    finally:
        for layer, inner in swapped:
            setattr(layer, LINEAR_ATTN, inner)
