"""The storage-tier contract: read one expert record into a caller's buffer; close
(docs/tiers.md, "The interface").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import attrs


@attrs.frozen
class ExpertKey:
    """A routed expert: model layer index and expert index within that layer."""

    layer: int
    expert: int


@attrs.frozen
class ReadInfo:
    """What one `read_into` did."""

    tier: str  # name of the tier that served the bytes ("ram", "direct", ...)
    nbytes: int
    started: float  # time.perf_counter() when the read began
    finished: float  # time.perf_counter() when the buffer was complete
    hit: bool = False  # served from a cache without touching the inner tier
    attempts: int = 1  # disk reads tried (2 when the first failed and the retry succeeded)
    waited: float = 0.0  # seconds spent queued (throttle slot, coalesced cache miss)
    disk_bytes: int | None = None  # bytes read from storage, when not nbytes (zstd frames)


@runtime_checkable
class Tier(Protocol):
    """The tier interface.

    `read_into` fills `dest` (a writable, C-contiguous buffer of exactly the
    record size) with the record of `key`, or raises `TierReadError`. A read
    that raises or is cancelled leaves `dest` with undefined content that
    callers must not use; once it has raised or been cancelled, no worker thread
    writes into `dest` any more, so the buffer may be reused at once.
    `aclose` waits for reads in flight and releases files and threads.

    Built-in tiers (the `tiers/` package) also accept their options as keyword
    arguments; see `edge0.storage.spec` for how a spec string builds a stack.
    """

    name: str

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo: ...

    async def aclose(self) -> None: ...


BlockingRead = Callable[[ExpertKey, memoryview], ReadInfo]


def blocking_read(tier: Tier) -> BlockingRead | None:
    """The tier's `read_blocking` (a read on the calling thread, safe from any thread) when it
    has one and says so (`blocking`, True only if every tier it wraps reads that way too)."""
    if not getattr(tier, "blocking", False):
        return None
    read: BlockingRead | None = getattr(tier, "read_blocking", None)
    return read
