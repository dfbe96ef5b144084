"""What a prompt chunk reads early of the next streamed layer (chunks.OVERLAP): router or head
(docs/runtime.md, "Prompt processing", overlap across layers).
"""

from __future__ import annotations

import mlx.core as mx

from edge0.errors import ConfigError
from edge0.runtime.layers.block import StreamingMoE

OVERLAPS = ("none", "router", "heads")


def check_overlap(overlap: str) -> None:
    """ConfigError unless `overlap` names a read-ahead."""
    if overlap not in OVERLAPS:
        raise ConfigError(f"prefill OVERLAP {overlap!r} is not one of {', '.join(OVERLAPS)}")


def next_union(
    overlap: str, block: StreamingMoE, following: StreamingMoE, x: mx.array, inds: mx.array
) -> mx.array | None:
    """Lazy (rows, K) experts of `following` predicted for chunk `x` (1, T, d), routed by this
    layer to `inds` (1, T, K); None when `overlap` has no prediction for it here."""
    stream, fam = block.stream, block.family
    if overlap == "router":
        return fam.select(following, fam.scores(following, x), stream.top_k)[0]
    head = stream.head
    rows = getattr(head.predictor, "rows", None) if head is not None else None
    if overlap != "heads" or head is None or rows is None or head.target.layer != following.layer:
        return None
    prev = stream.prev_inds  # (1, 1, K) the token before the chunk, None in a request's first
    if prev is None:  # the first token has no previous set: its row is left out
        x, inds, prev = x[:, 1:], inds[:, 1:], inds[:, :-1]
    else:
        prev = mx.concatenate([prev, inds[:, :-1]], axis=1)  # (1, T, K): each token's t-1
    t = x.shape[1]
    got: mx.array = rows(
        stream.layer,
        x.reshape(t, x.shape[-1]),
        inds.reshape(t, -1),
        prev.reshape(t, -1),
        stream.top_k,
    )
    return got  # (T or T - 1, K)
