"""Eviction policies of the RAM tier: LRU and LFUDA (LFU with dynamic aging), over unpinned keys."""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable
from typing import Protocol


class Policy(Protocol):
    def insert(self, key: Hashable) -> None: ...
    def touch(self, key: Hashable) -> None: ...
    def remove(self, key: Hashable) -> None: ...
    def victim(self) -> Hashable | None: ...  # the key to evict next (not removed)
    def evicted(self, key: Hashable) -> None: ...  # `victim()` was evicted


class LruPolicy:
    """Least recently used first."""

    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def insert(self, key: Hashable) -> None:
        self._order[key] = None

    def touch(self, key: Hashable) -> None:
        self._order.move_to_end(key)

    def remove(self, key: Hashable) -> None:
        self._order.pop(key, None)

    def victim(self) -> Hashable | None:
        return next(iter(self._order), None)

    def evicted(self, key: Hashable) -> None:
        self.remove(key)


class LfudaPolicy:
    """LFU with dynamic aging (Arlitt et al., 2000): priority = hits + age L.

    Evicting a key sets L to its priority, so keys that were popular long ago
    eventually lose to recently inserted ones. Ties go to the older entry.
    Keeps a heap with lazy invalidation: a stale heap entry is skipped.
    """

    def __init__(self) -> None:
        self.age = 0.0  # L
        self._freq: dict[Hashable, int] = {}
        self._prio: dict[Hashable, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._tick = itertools.count()

    def _push(self, key: Hashable) -> None:
        entry = (self.age + self._freq[key], next(self._tick))
        self._prio[key] = entry
        heapq.heappush(self._heap, (*entry, key))

    def insert(self, key: Hashable) -> None:
        self._freq[key] = self._freq.get(key, 0) + 1
        self._push(key)

    def touch(self, key: Hashable) -> None:
        self._freq[key] += 1
        self._push(key)

    def remove(self, key: Hashable) -> None:
        self._prio.pop(key, None)
        self._freq.pop(key, None)
        if len(self._heap) > 4 * len(self._prio) + 64:  # drop stale entries now and then
            self._heap = [e for e in self._heap if self._prio.get(e[2]) == e[:2]]
            heapq.heapify(self._heap)

    def victim(self) -> Hashable | None:
        while self._heap:
            prio, tick, key = self._heap[0]
            if self._prio.get(key) == (prio, tick):
                return key
            heapq.heappop(self._heap)
        return None

    def evicted(self, key: Hashable) -> None:
        """Call instead of `remove` when `key` is evicted: ages the cache."""
        entry = self._prio.get(key)
        if entry is not None:
            self.age = entry[0]
        self.remove(key)


def make_policy(name: str) -> Policy:
    if name == "lru":
        return LruPolicy()
    if name == "lfuda":
        return LfudaPolicy()
    raise ValueError(f"unknown eviction policy {name!r}; use lru or lfuda")
