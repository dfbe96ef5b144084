"""The rows of a batched decode step as one stacked forward over batch caches kept across steps
(docs/runtime.md, "Batched decode": which models stack, merge and extract).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache, make_prompt_cache

from edge0.errors import Edge0Error
from edge0.families import for_model
from edge0.runtime.compute.rows import RowState

_MERGEABLE = (KVCache, RotatingKVCache, ArraysCache)


def _mergeable(cache: Any) -> bool:
    if type(cache) is CacheList:
        return all(_mergeable(c) for c in cache.caches)
    if type(cache) is RotatingKVCache:  # its batch form hands back caches that keep nothing
        return cache.keep == 0
    return type(cache) in _MERGEABLE


def stack_refusal(model: Any) -> str | None:
    """Why `model`'s rows cannot run as one stacked forward; None when they can."""
    family = for_model(model)
    if not family.stacks:
        return f"the {family.name} family is not tested with batch caches"
    kinds = {type(c).__name__ for c in make_prompt_cache(model) if not _mergeable(c)}
    if kinds:
        return f"caches without a batch form: {', '.join(sorted(kinds))}"
    return None


class HeldCache:
    """Stands for a row's layer cache while it is merged into a stack: any use is an error."""

    def __getattr__(self, name: str) -> Any:
        raise Edge0Error(
            "this request's KV cache is merged into a batched step's stack; "
            "Stack.release() hands it back before the request runs alone"
        )

    def __bool__(self) -> bool:
        return True


class Stack:
    """The merged per-layer caches of the rows of the last stacked step."""

    def __init__(self) -> None:
        self.rows: tuple[RowState, ...] = ()
        self.caches: list[Any] | None = None
        self.merges = 0  # how many times rows were merged (tests: not once per step)

    def hold(self, rows: Sequence[RowState]) -> list[Any]:
        """The merged caches of `rows` (in this order): reused while the rows do not change."""
        if self.caches is not None and tuple(rows) == self.rows:
            return self.caches
        self.release()
        per_row = [r.runner.cache for r in rows]
        caches = [c.merge([pr[j] for pr in per_row]) for j, c in enumerate(per_row[0])]
        mx.eval([_arrays(c) for c in caches])  # the rows' own caches can go now
        for pr in per_row:
            pr[:] = [HeldCache()] * len(pr)
        self.rows, self.caches = tuple(rows), caches
        self.merges += 1
        return caches

    def release(self) -> None:
        """Hand every row of the stack its own cache back (it may run alone, or rejoin)."""
        if self.caches is None:
            return
        for i, row in enumerate(self.rows):
            row.runner.cache[:] = [c.extract(i) for c in self.caches]
        self.drop()

    def drop(self) -> None:
        """Forget the stack without handing anything back (its step failed: its rows end)."""
        self.rows, self.caches = (), None


def _arrays(cache: Any) -> list[mx.array]:
    """The arrays a (batch) cache holds, for one eval after a merge."""
    state = cache.state
    out: list[mx.array] = []

    def walk(v: Any) -> None:
        if isinstance(v, mx.array):
            out.append(v)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)

    walk(state)
    return out
