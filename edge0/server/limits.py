"""The limits `edge0 serve` holds against slow, many and oversized clients (docs/server.md)."""

from __future__ import annotations

from typing import Any

import attrs

MAX_CONNECTIONS = 1024
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
KEEP_ALIVE_S = 5
MAX_HEADER = 16 << 10  # bytes of request line and headers (h11's own default)
MAX_QUEUE = 32


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:  # also refuses nan
        raise ValueError(f"{attribute.name} must be above 0, not {value}")


@attrs.frozen
class Limits:
    """Connections, time and queue: what a client may hold of the server.

    max_connections: open connections; one more is answered 503 and closed at once.
    header_timeout: seconds from a connection's first byte (or its request's) to the end
        of the request's headers; past it, 408 and closed.
    body_timeout: seconds to receive a whole request body; past it, 408 and closed.
    keep_alive: seconds an idle connection stays open between requests.
    max_header: bytes of request line and headers; more is a 400.
    max_queue: requests (choices) waiting for the engine beyond the `max_batch` it decodes
        together; one more is answered 429 (OpenAI) or 529 (Anthropic) with Retry-After.
    """

    max_connections: int = attrs.field(default=MAX_CONNECTIONS, validator=_positive)
    header_timeout: float = attrs.field(default=HEADER_TIMEOUT_S, validator=_positive)
    body_timeout: float = attrs.field(default=BODY_TIMEOUT_S, validator=_positive)
    keep_alive: int = attrs.field(default=KEEP_ALIVE_S, validator=_positive)
    max_header: int = attrs.field(default=MAX_HEADER, validator=_positive)
    max_queue: int = attrs.field(default=MAX_QUEUE, validator=attrs.validators.ge(0))
