"""What a prompt chunk reads early of the next streamed layer (chunks.OVERLAP): router or head.

While a streaming block computes its chunk, the next streamed layer's first group
of experts can already be read (edge0.runtime.prefill.chunk_moe.read_ahead). Which ones is
a prediction of that layer's union for the chunk, a lazy graph evaluated with this
layer's routing, in one of two ways:
  - "router": the next layer's router on this layer's chunk input, each token's
    top-K (the next layer's set of the same token, had it this layer's input);
  - "heads": the prerouter head this layer owns (a `Lookahead`, hint and route
    modes) on every token of the chunk, with its executed set and the one
    before it as the head's temporal inputs: each row predicts the next layer's
    set of the NEXT token, so the rows' union is the next layer's union shifted
    by one token. Only heads with an MLX graph (`rows`, edge0.routing.predictors)
    predict here: host predictors (oracle, temporal) and reactive mode (no
    heads) read nothing early. Untrained lean heads (predictor "init") are the
    next layer's router logits: with a plain top-K router they predict the sets
    "router" does (less a request's first token, which has no row).
Only what is read early changes: routing and compute are the chunk's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from edge0.errors import ConfigError

if TYPE_CHECKING:
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
