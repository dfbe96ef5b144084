"""`SamplingSettings`: how tokens are chosen, each setting declared once (docs/architecture.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

from edge0.errors import ConfigError
from edge0.options.declare import check_declared, opt

if TYPE_CHECKING:
    import mlx.core as mx

SEED_MAX = 2**64 - 1
GENERATE = ("run",)  # the commands whose flags include the sampler's settings


class TokenHooks(Protocol):
    """What a request adds to its sampler, called on the compute thread once per draw."""

    def mask(self, logprobs: mx.array) -> mx.array:
        """The (1, vocab) log-probabilities to draw from (disallowed tokens at -inf)."""
        ...

    def drawn(self, logprobs: mx.array, token: mx.array) -> None:
        """After the draw: the model's own (1, vocab) log-probabilities and the drawn token."""
        ...


@attrs.frozen
class SamplingSettings:
    """How tokens are chosen. temp 0 is greedy; top_p 1.0 / top_k 0 / min_p 0 are off.

    With a seed, every request with these settings draws the same tokens (in every
    mode: the sampler owns its random key). Invalid values raise ConfigError.
    """

    max_tokens: int = opt(
        128, "Most tokens to generate.", kind=int, flag="--max-tokens", commands=GENERATE, low=1
    )
    temp: float = opt(
        0.0,
        "Sampling temperature; 0 is greedy.",
        kind=float,
        flag="--temp",
        commands=GENERATE,
        low=0.0,
        finite=True,
    )
    top_p: float = opt(
        1.0,
        "Nucleus sampling mass; 1.0 is off.",
        kind=float,
        flag="--top-p",
        commands=GENERATE,
        low=0.0,
        high=1.0,
    )
    top_k: int = opt(
        0,
        "Sample among the k most likely tokens; 0 is off.",
        kind=int,
        flag="--sample-top-k",
        commands=GENERATE,
        low=0,
        dest="sample_top_k",  # `top_k` is the engine's routing capacity (--top-k)
    )
    min_p: float = opt(
        0.0,
        "Drop tokens below min-p times the top probability; 0 is off.",
        kind=float,
        flag="--min-p",
        commands=GENERATE,
        low=0.0,
        high=1.0,
    )
    seed: int | None = opt(
        None,
        "Random seed for sampling.",
        kind=int,
        flag="--seed",
        commands=GENERATE,
        low=0,
        high=SEED_MAX,
    )
    # per-request token hooks (a token mask, log-probabilities): see TokenHooks
    hooks: TokenHooks | None = attrs.field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        try:
            check_declared(self)
        except ConfigError as exc:
            raise ConfigError(f"sampling {exc}") from None
