"""Prefill figures of `edge0 bench run`: prompt tok/s of chunked over one-token prefill."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from edge0.bench.run import Variant, paired_ratios


def parse_chunks(text: str) -> list[int | None]:
    """ "1,64" -> [1, 64]; "" -> [None] (the engine's default chunk)."""
    if not text.strip():
        return [None]
    try:
        chunks: list[int | None] = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--prefill-chunk takes integers like 1,64, not {text!r}") from None
    if any(c is None or c < 1 for c in chunks):
        raise ValueError(f"--prefill-chunk values must be at least 1, got {text!r}")
    return chunks


def prefill_ratios(
    variants: Sequence[Variant], runs: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Prefill tok/s of each chunked variant over the same variant at chunk 1, per round."""
    return paired_ratios(
        variants,
        runs,
        lambda v: None if v.prefill_chunk in (None, 1) else attrs.evolve(v, prefill_chunk=1),
        "prefill_tps",
    )


def ratio_lines(rs: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"- {r['variant']} / {r['over']}: {r['median']:.2f}x prefill tok/s (median of per-round "
        f"ratios {', '.join(f'{x:.2f}' for x in r['per_round'])})"
        for r in rs
    )
