"""The predictions staged ahead: the sets prefetched per (layer, step), and this step's claims on
them (docs/runtime.md, "The I/O room"). Pure and synchronous: its caller holds the table's lock."""

from __future__ import annotations

from edge0.runtime.io.slots import SlotPool

Key = tuple[int, int]  # (layer, step)


class Staging:
    """What each (layer, step) was prefetched for, and the slots this step claimed from it."""

    def __init__(self, pool: SlotPool) -> None:
        self.pool = pool
        # (layer, step) -> experts prefetched for it: the only slots `acquire` may release
        self.ahead: dict[Key, set[int]] = {}
        # (layer, step) -> the one set prefetched for it, in order (the step claim's input)
        self.planned: dict[Key, list[int]] = {}
        # layer -> (experts, slots, pool.steals when claimed): this step's claimed layers
        self.claims: dict[int, tuple[list[int], list[int], int]] = {}
        order = sorted(pool.order, key=pool.order.__getitem__)
        self._later = {layer: order[i:] for i, layer in enumerate(order)}

    def add(self, layer: int, step: int, experts: list[int]) -> None:
        """`experts` of `layer` are prefetched for `step` (a second set makes a union)."""
        ahead = self.ahead.get((layer, step))
        if ahead is None:
            self.ahead[(layer, step)] = set(experts)
            self.planned[(layer, step)] = experts  # what the step claim checks
        else:
            ahead.update(experts)
            self.planned.pop((layer, step), None)  # a union: acquire alone decides

    def claimed(self, layer: int, step: int, experts: list[int]) -> list[int] | None:
        """The slots of `experts` when the step claim holds exactly them, staged and ready,
        none stolen since (the prediction is spent); None: take the slow path."""
        claims = self.claims
        claim = claims.pop(layer, None)
        if claim is None and (layer, step) in self.planned:
            self._claim_step(step, layer)  # this and every later layer staged by now
            claim = claims.pop(layer, None)
        if claim is None or claim[2] != self.pool.steals or claim[0] != experts:
            return None
        self.ahead.pop((layer, step), None)
        self.planned.pop((layer, step), None)
        return claim[1]

    def _claim_step(self, step: int, first: int) -> None:
        """Claim, in one pass, the slots of `first` and of every later layer whose one
        prefetched set for `step` is staged and ready (no read, no wait): their acquire
        then only checks that the set asked is that set and that no slot was stolen since.
        Only a steal takes a claimed slot (its reader, this step's layer, is not evaluated)."""
        pool, planned, claims = self.pool, self.planned, self.claims
        for layer in self._later[first]:
            experts = planned.get((layer, step))
            if experts is None or layer in claims:
                continue
            slots = pool.claim(layer, experts, step)
            if slots is not None:
                claims[layer] = (experts, slots, pool.steals)

    def unneeded(self, layer: int, step: int, needed: list[int]) -> list[int]:
        """Predicted experts that compute will not read at `step`: their slots released (the
        caller cancels their reads if queued). Only a prefetch for (`layer`, `step`) gives
        a slot that reader before this acquire."""
        ahead = self.ahead.pop((layer, step), None)
        self.planned.pop((layer, step), None)
        if not ahead:
            return []
        pool, out = self.pool, []
        for e in ahead.difference(needed):
            s = pool.where[layer].get(e)
            if s is None or not pool.reserved_for(s, step):
                continue
            pool.release(layer, e, step)
            out.append(s)
        return out

    def expire(self, step: int) -> None:
        """Step `step` began: predictions for earlier steps expire."""
        for key in [k for k in self.ahead if k[1] < step]:
            del self.ahead[key]  # predicted for a step that has passed
            self.planned.pop(key, None)

    def clear(self) -> None:
        self.ahead.clear()
        self.planned.clear()
        self.claims.clear()
