"""One request between the engine's worker and its consumer: a token queue, its state, its stats
(docs/runtime.md, "The Engine API": no consumer can stall the worker).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

import attrs

from edge0.errors import Edge0Error
from edge0.model.generate import SamplingSettings
from edge0.runtime.engine.summary import RunStats

_DONE = object()


class EngineClosedError(Edge0Error):
    """The engine closed before the request finished."""


@attrs.define(eq=False)
class Request:
    """One generation request: the prompt ids, its settings, and the hand-off queue."""

    id: int
    ids: list[int]
    max_tokens: int
    settings: SamplingSettings
    eos: frozenset[int]
    state: str = "queued"  # queued -> running -> done
    cancelled: bool = False  # the consumer went away: stop after the step in flight
    stats: RunStats | None = None
    on_pull: Callable[[], None] | None = None  # the consumer took a token or went away
    _out: asyncio.Queue[Any] = attrs.field(factory=asyncio.Queue)
    _done: asyncio.Event = attrs.field(factory=asyncio.Event)

    # --- worker side -------------------------------------------------------------------
    def put(self, token: int) -> None:
        self._out.put_nowait(token)

    @property
    def backlog(self) -> int:
        """Tokens put and not yet taken by the consumer."""
        return self._out.qsize()

    def finish(self, error: BaseException | None = None) -> None:
        """End the stream: the consumer gets `error` raised, or the end of its tokens."""
        if self.state == "done":
            return
        self.state = "done"
        self._out.put_nowait(_DONE if error is None else error)
        self._done.set()

    # --- consumer side -----------------------------------------------------------------
    async def stream(self) -> AsyncGenerator[int, None]:
        """The generated ids; closing it early cancels the request (after its current step)."""
        try:
            while True:
                item = await self._out.get()
                if self.on_pull is not None:
                    self.on_pull()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # never waits for the worker: a stuck read must not trap the consumer
            if self.state != "done":
                self.cancelled = True
                if self.on_pull is not None:
                    self.on_pull()

    async def wait(self) -> None:
        """Until the worker has finished (or skipped) this request."""
        await self._done.wait()
