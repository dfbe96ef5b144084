"""The prompt chunk the memory plan chooses when `--prefill-chunk` is not given: what a chunk
holds against its share of the budget, and how far its reads amortise (docs/memory.md).
"""

from __future__ import annotations

import attrs

_MIB = 1 << 20
DEFAULT_CHUNK = 256  # prompt tokens per forward without a budget, and the least a budget aims at
PROMPT_SHARE = 2  # an unasked prompt chunk takes at most 1/2 of what the fixed parts leave
AMORTISE = 16  # a chunk grows until a prompt token reads 1/16 of what one-token prefill reads
MAX_AIM = 1 << 16  # nor past this many tokens, whatever the layer's experts


@attrs.frozen
class ChunkChoice:
    tokens: int  # prompt tokens per forward (1: one token per step)
    bytes: int  # what the chunk holds
    note: str  # the trade-off, for the plan's line


def union(experts: int, k: int, tokens: int) -> float:
    """Expected distinct experts a layer reads for `tokens` tokens of `k` picks each, were the
    picks spread evenly (real routing repeats experts more, so it reads fewer)."""
    if k >= experts:
        return float(experts)
    return experts * (1.0 - (1.0 - k / experts) ** tokens)


def saving(experts: int, k: int, tokens: int) -> float:
    """How many times fewer records a prompt token reads in a chunk of `tokens` than alone."""
    return tokens * k / union(experts, k, tokens)


def amortised(experts: int, k: int, cap: int) -> int:
    """The smallest chunk (at most `cap`) whose prompt tokens read AMORTISE times fewer records
    than one token per step does; `saving` grows with the chunk, so a bisection finds it."""
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi) // 2
        if saving(experts, k, mid) >= AMORTISE:
            hi = mid
        else:
            lo = mid + 1
    return lo


def choose(
    left: int, fixed: int, per_token: int, experts: int, k: int, context: int
) -> ChunkChoice:
    """The largest chunk whose bytes (`fixed + tokens x per_token`) fit 1/PROMPT_SHARE of
    `left`, up to where its reads amortise (at least DEFAULT_CHUNK; never past `context`).

    `experts`/`k`: a streamed layer's experts and a token's picks (0 experts: nothing is
    streamed, the chunk stops at DEFAULT_CHUNK). What the chunk does not take buys slots.
    """
    aim = DEFAULT_CHUNK
    if experts and k:
        aim = max(DEFAULT_CHUNK, amortised(experts, k, MAX_AIM))
    if context:
        aim = min(aim, context)
    share = left // PROMPT_SHARE
    fit = (share - fixed) // per_token if per_token else aim
    tokens = max(1, min(aim, fit))
    if tokens <= 1:
        two = fixed + 2 * per_token
        return ChunkChoice(
            1,
            0,
            f"one prompt token per step: a 2-token chunk holds {two / _MIB:.0f} MiB, more than "
            f"half of the {left / _MIB:.0f} MiB left",
        )
    size = fixed + tokens * per_token
    if not experts or not k:
        return ChunkChoice(tokens, size, "")
    saved = f"a prompt token reads ~{saving(experts, k, tokens):.1f}x fewer expert records than "
    saved += "one token per step"
    if tokens == aim:
        if context and aim == context:
            why = "the context: no prompt is longer"
        elif aim > DEFAULT_CHUNK:
            why = (
                f"~{AMORTISE}x, where its reads amortise: a larger one would take slots for little"
            )
        else:
            why = "the default: its reads amortise sooner"
        return ChunkChoice(
            tokens, size, f"the prompt chunk stops at {tokens} tokens ({why}); {saved}"
        )
    need = fixed + aim * per_token
    return ChunkChoice(
        tokens,
        size,
        f"the prompt chunk takes {tokens} tokens, the most half of the {left / _MIB:.0f} MiB "
        f"left holds (the rest is for slots): {saved}; {aim} tokens "
        f"(~{saving(experts, k, aim):.0f}x) would need {need / _MIB:.0f} MiB",
    )
