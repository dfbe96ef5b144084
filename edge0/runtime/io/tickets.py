"""FetchTicket (one expert read for one step), the priority queue the readers drain, and the
scheduler's read counters."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import attrs

DEMAND = "demand"  # compute is (or will shortly be) waiting for it at this step
PREFETCH = "prefetch"  # issued one step ahead from a prediction


@attrs.define(eq=False)
class FetchTicket:
    """One read of one expert record into one slot, and what became of it."""

    request: int
    step: int  # the step whose compute needs the expert
    layer: int  # model layer index
    expert: int
    slot: int
    kind: str  # DEMAND or PREFETCH
    order: int  # position of `layer` among the streamed layers (compute order)
    issued: float = attrs.field(factory=time.perf_counter)
    started: float = 0.0
    finished: float = 0.0
    tier: str = ""
    nbytes: int = 0
    hit: bool = False  # served by a cache tier
    worker: int = -1
    outcome: str = "queued"  # queued | running | ok | error | cancelled
    consumed: bool = False  # compute read the slot this ticket filled
    error: BaseException | None = None

    def sort_key(self) -> tuple[int, int]:
        """Tickets are served in the order compute will need them: step, then layer."""
        return (self.step, self.order)

    def fields(self) -> dict[str, Any]:
        """The ticket as flat log/trace fields (times in ms relative to `issued`)."""
        return {
            "request": self.request,
            "step": self.step,
            "layer": self.layer,
            "expert": self.expert,
            "slot": self.slot,
            "kind": self.kind,
            "tier": self.tier,
            "bytes": self.nbytes,
            "hit": self.hit,
            "worker": self.worker,
            "outcome": self.outcome,
            "queued_ms": round((self.started - self.issued) * 1e3, 3) if self.started else None,
            "read_ms": round((self.finished - self.started) * 1e3, 3) if self.finished else None,
        }


class TicketQueue:
    """A priority queue of tickets keyed by `sort_key`; lives on the event loop thread."""

    def __init__(self) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, int, FetchTicket]] = (
            asyncio.PriorityQueue()
        )
        self._seq = itertools.count()

    def put(self, ticket: FetchTicket) -> None:
        step, order = ticket.sort_key()
        self._queue.put_nowait((step, order, next(self._seq), ticket))

    async def get(self) -> FetchTicket:
        return (await self._queue.get())[3]

    def qsize(self) -> int:
        return self._queue.qsize()


@attrs.define
class ReadStats:
    """Counters of the scheduler (cumulative; the engine takes differences per request)."""

    issued: int = 0
    demand: int = 0
    prefetch: int = 0
    consumed: int = 0
    cancelled: int = 0
    failed: int = 0
    bytes: int = 0
    hits: int = 0  # served from a cache tier
    staged_hits: int = 0  # compute found the expert already staged or in flight
    staged_misses: int = 0  # compute had to issue a demand read
    fences: int = 0  # acquire found the pool full of unevaluated readers (FenceNeeded)
    read_busy_s: float = 0.0  # wall time with at least one read in flight
    by_tier: dict[str, int] = attrs.field(factory=dict)
