"""Graceful stop of `edge0 serve` (Ctrl-C, SIGTERM): in-flight requests get a grace period.

When uvicorn starts shutting down it stops accepting connections; `DrainingServer`
then gives the requests in flight `grace` seconds to finish as usual. Those still
running after that are cut: a whole answer becomes a 503 error body, a stream ends
with an error event, both in the API's own shape, and the engine stops their work
after the step in flight. Only then does the lifespan close the engine (which
writes a `--trace` file).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import uvicorn

from edge0.errors import RequestError
from edge0.log import get_logger

log = get_logger("edge0.server")
BACKSTOP_S = 30.0  # after the cut, uvicorn waits this long before cancelling what is left


class Drain:
    """The server's stop state: `stopping` once shutdown begins, `cut` when grace runs out."""

    def __init__(self) -> None:
        self.stopping = False
        self._cut: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.on_stop: list[Callable[[], None]] = []  # called once shutdown begins (event streams)

    @property
    def cut(self) -> asyncio.Event:
        """Set when the requests still running must end (created in the running loop)."""
        if self._cut is None:
            self._cut = asyncio.Event()
        return self._cut

    def begin(self, grace: float) -> None:
        """Start the grace period (in the server's loop); calling it again changes nothing."""
        if self.stopping:
            return
        self.stopping = True
        log.info("server.draining", grace_s=grace)
        for stop in self.on_stop:
            stop()
        self._timer = asyncio.get_running_loop().call_later(grace, self.cut.set)

    def error(self) -> RequestError:
        return RequestError(
            "the server is shutting down and this request ran past its grace "
            "period (`edge0 serve --shutdown-grace`); send it again once the "
            "server is back",
            status=503,
            code="shutting_down",
        )


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a grace period for in-flight requests before it stops."""

    def __init__(self, config: uvicorn.Config, drain: Drain, grace: float) -> None:
        config.timeout_graceful_shutdown = int(grace + BACKSTOP_S)
        super().__init__(config)
        self.drain = drain
        self.grace = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain.begin(self.grace)
        await super().shutdown(sockets)
