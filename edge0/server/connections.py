"""Connections below ASGI: a cap on open connections, a deadline for each request's head, errors
in the API's shape for what never becomes a request, and a lingering close.

uvicorn's h11 protocol has no timer before the first request and none while a request's
headers trickle in, so a client that stops mid-header holds its socket (and a file
descriptor) forever; `limit_concurrency` counts connections only once a request's head is
complete and answers in plain text. `GuardedH11` adds what is missing:

- a connection past `Limits.max_connections` is answered 503 (Retry-After) and closed
  before it can send a byte;
- a request head not complete `Limits.header_timeout` seconds after its first byte (or
  after the connection opened) is answered 408 and closed;
- broken HTTP (h11's 400) and a Content-Length too long for h11 to parse (over 20 digits:
  413) are answered in the shape of the API the request line names;
- a close with a request body still arriving (a 413, a 408) is lingering: the answer and a
  FIN go out, what the client still sends is read and dropped for up to LINGER_S seconds,
  so the client reads its answer instead of a reset;
- a body left unread by an answer that did not need it (a 401, a 404) may follow within
  the body timeout, then the connection closes (as above).

Each answer is counted in /metrics (route "connection" when no route was reached).
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import re
import sys
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from edge0.log import get_logger
from edge0.server.http import error_body
from edge0.server.limits import Limits
from edge0.server.metrics import CONNECTION_ROUTE, ServerMetrics

log = get_logger("edge0.server")
LINGER_S = 2.0  # how long a closing connection still reads (and drops) a client's body
_REQUEST_LINE = re.compile(rb"^([A-Z]{1,16}) (\S{1,2048}) HTTP/")
_LENGTH = re.compile(rb"^content-length:[ \t]*(\d+)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)


class _Lingering:
    """The connection's transport, whose `close` lingers while the request body still comes."""

    def __init__(self, inner: asyncio.Transport, protocol: GuardedH11) -> None:
        self._inner = inner
        self._protocol = protocol
        self._closing = False

    def close(self) -> None:
        if self._closing or self._inner.is_closing():
            return
        self._closing = True
        if self._protocol.conn.their_state is h11.SEND_BODY and self._inner.can_write_eof():
            self._protocol.linger()
        else:
            self._inner.close()

    def is_closing(self) -> bool:
        return self._closing or self._inner.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _NoBadHttpWarning(logging.Filter):
    """Drops uvicorn's warning per broken request (`GuardedH11.refuse` logs each at info): a
    flood of broken requests would flood the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Invalid HTTP request received."


_QUIET = _NoBadHttpWarning()


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the connection cap, the head deadline and the lingering
    close of `Limits` (set on the subclass `guarded_protocol` makes)."""

    limits: Limits = Limits()
    metrics: ServerMetrics | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._raw = transport
        self.transport = _Lingering(transport, self)  # type: ignore[assignment]
        self._head = bytearray()  # the current request's first bytes (request line, length)
        self._timer: asyncio.TimerHandle | None = None  # the head's deadline
        self._drain: asyncio.TimerHandle | None = None  # an unread body's or a linger's end
        self._lingering = False
        if len(self.connections) > self.limits.max_connections:
            self.refuse(
                503,
                f"the server holds its limit of {self.limits.max_connections} connections "
                "(`edge0 serve --max-connections`); retry shortly",
                "connections",
                retry_after=1,
            )
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()  # no timer keeps a closed connection (and its buffers) alive
        self._cancel_drain()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the answer is out: the rest of the body is dropped
        if self.conn.their_state is h11.IDLE:
            if self._timer is None:
                self._arm()
            room = self.limits.max_header - len(self._head)
            if room > 0:
                self._head += data[:room]
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()
            self._head.clear()

    def on_response_complete(self) -> None:
        unread = self.conn.their_state is h11.SEND_BODY  # answered before its body was read
        if unread and not self.transport.is_closing():  # (a 401): it may come within the
            self._cancel_drain()  # body timeout, then the connection closes
            self._drain = self.loop.call_later(self.limits.body_timeout, self._drain_timeout)
        super().on_response_complete()

    def _drain_timeout(self) -> None:
        self._drain = None
        if self.conn.their_state is h11.SEND_BODY:
            self.transport.close()  # lingers

    def _cancel_drain(self) -> None:
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None

    def send_400_response(self, msg: str) -> None:
        """h11 refused the request head: 400 (or 413 for a Content-Length of more digits
        than h11 parses), in the API's shape."""
        cause = sys.exc_info()[1]
        length = _LENGTH.search(bytes(self._head))
        if "Content-Length" in str(cause) and length is not None:
            digits = len(length.group(1))
            self.refuse(
                413,
                f"the request body is declared as a {digits}-digit number of bytes; "
                "this server takes far fewer (`edge0 serve --max-body`)",
                "too_large",
            )
            return
        detail = str(cause) if cause is not None else msg
        self.refuse(400, f"malformed HTTP request: {detail}", "bad_http")

    def refuse(
        self, status: int, message: str, reason: str, retry_after: int | None = None
    ) -> None:
        """Answer `status` with an error body in the API's shape, then close (lingering)."""
        self._disarm()
        if self._raw.is_closing():
            return
        method, path = self._request_line()
        body = json.dumps(error_body(path, status, message)).encode()
        lines = [
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
            *([f"retry-after: {retry_after}"] if retry_after is not None else []),
        ]
        self._raw.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        if self.metrics is not None:
            self.metrics.refused(CONNECTION_ROUTE, method, status, reason)
        log.info("server.refused", status=status, reason=reason, client=str(self.client))
        self.linger()

    def linger(self) -> None:
        """Send FIN after what is written, drop what still arrives, close within LINGER_S."""
        if self._lingering:
            return
        self._lingering = True
        self._disarm()
        self._cancel_drain()
        if self._raw.is_closing():
            return
        if not self._raw.can_write_eof():
            self._raw.close()
            return
        self._raw.write_eof()
        self._raw.resume_reading()
        self._drain = self.loop.call_later(LINGER_S, self._raw.close)  # cancelled once closed

    def eof_received(self) -> None:
        if self._lingering:
            self._raw.close()

    def _request_line(self) -> tuple[str, str]:
        if self.scope is not None and self.conn.their_state is not h11.IDLE:
            return str(self.scope["method"]), str(self.scope["path"])
        match = _REQUEST_LINE.match(bytes(self._head))
        if match is None:
            return "other", ""
        return match.group(1).decode(), match.group(2).decode("latin-1")

    def _arm(self) -> None:
        self._timer = self.loop.call_later(self.limits.header_timeout, self._head_timeout)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timeout(self) -> None:
        self._timer = None
        if self.conn.their_state is h11.IDLE and not self._raw.is_closing():
            self.refuse(
                408,
                f"the request's headers did not arrive within {self.limits.header_timeout:g} s "
                "(`edge0 serve --header-timeout`)",
                "header_timeout",
            )


def guarded_protocol(limits: Limits, metrics: ServerMetrics | None) -> type[GuardedH11]:
    """`GuardedH11` bound to these limits and metrics (uvicorn builds one per connection)."""
    return type("GuardedH11", (GuardedH11,), {"limits": limits, "metrics": metrics})


def uvicorn_config(
    app: Any,
    limits: Limits,
    metrics: ServerMetrics | None,
    log_level: str = "warning",
    access_log: bool = False,
) -> uvicorn.Config:
    """uvicorn's configuration for the app: h11 with the guarded protocol, the keep-alive
    timeout and the head size of `limits`, the engine's own event loop."""
    logging.getLogger("uvicorn.error").addFilter(_QUIET)  # once: the same filter object
    return uvicorn.Config(
        app,
        http=guarded_protocol(limits, metrics),
        timeout_keep_alive=limits.keep_alive,
        h11_max_incomplete_event_size=limits.max_header,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        loop="none",
    )
