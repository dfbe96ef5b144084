"""One request's state in a batched decode step (edge0.runtime.compute.batch): its runner and
what a layer stream keeps for a request alone."""

from __future__ import annotations

import attrs
import mlx.core as mx

from edge0.runtime.compute.runner import Runner


@attrs.define(eq=False)
class RowState:
    """One request of a batch: its runner (cache, sampler) and its per-layer stream state."""

    runner: Runner
    request: int
    pos: int = -1  # position of the token fed last
    more: bool = True  # a step follows this one: its predictions are used
    cur: dict[int, list[int]] = attrs.field(factory=dict)  # layer -> set planned for this step
    next: dict[int, list[int]] = attrs.field(factory=dict)  # layer -> set for the next step
    prev_experts: dict[int, list[int] | None] = attrs.field(factory=dict)
    prev_inds: dict[int, mx.array | None] = attrs.field(factory=dict)
    error: BaseException | None = None
