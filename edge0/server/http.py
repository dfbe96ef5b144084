"""HTTP plumbing of the server: bounded JSON bodies, client-disconnect watching, error bodies.

Errors take the shape of the API the route belongs to: OpenAI's
`{"error": {"message", "type", "param", "code"}}` everywhere but `/v1/messages`,
which answers Anthropic's `{"type": "error", "error": {"type", "message"}}` (and 529
where OpenAI's shape says 429). A 408 or 413 closes the connection: the body may still
be on its way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from edge0.errors import ConfigError, Edge0Error, PromptError, RequestError, TierReadError
from edge0.log import get_logger
from edge0.server.drain import Drain
from edge0.server.jsonbody import parse_object

log = get_logger("edge0.server")
T = TypeVar("T")
ANTHROPIC_PREFIX = "/v1/messages"
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the logs do
INLINE_PARSE = 16 << 10  # bodies up to this size parse on the loop, larger ones in a thread

OVERLOADED = 529  # Anthropic's status for "overloaded", where OpenAI's shape answers 429
_CLOSE_AFTER = (408, 413)  # answered before the body was read: the connection cannot go on
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "requests",
    503: "server_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
    503: "overloaded_error",
    OVERLOADED: "overloaded_error",
}


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


def api_status(path: str, status: int) -> int:
    """The status the API of `path` answers for `status` (Anthropic: 529 for 429)."""
    return OVERLOADED if status == 429 and path.startswith(ANTHROPIC_PREFIX) else status


def error_body(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The error object of the API that serves `path`."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates
    status = api_status(path, status)
    if path.startswith(ANTHROPIC_PREFIX):
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    path: str,
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    extra = dict(headers or {})
    if status in _CLOSE_AFTER:
        extra["connection"] = "close"
    body = error_body(path, status, message, param, code)
    return JSONResponse(body, status_code=api_status(path, status), headers=extra)


def status_of(exc: Edge0Error) -> tuple[int, str | None]:
    """HTTP status and error code for an Edge0Error raised while serving a request."""
    if isinstance(exc, RequestError):
        return exc.status, exc.code
    if isinstance(exc, PromptError | ConfigError):  # at request time: the prompt or sampling
        return 400, None
    if isinstance(exc, TierReadError):
        return 500, "tier_error"
    return 500, None


def stream_error(exc: Exception, path: str) -> tuple[int, str | None, str]:
    """Status, code and message for an error that ends a stream already under way."""
    if isinstance(exc, Edge0Error):
        status, code = status_of(exc)
        log.info("server.stream_failed", path=path, status=status, error=str(exc))
        return status, code, str(exc)
    log.exception("server.internal_error", path=path)
    return 500, None, f"internal error: {type(exc).__name__}: {exc}"


def api_route(
    handler: Callable[[Request], Coroutine[Any, Any, Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """Wraps a route: Edge0Errors and surprises become error bodies; a gone client, a 499."""

    async def route(request: Request) -> Response:
        path = request.url.path
        try:
            return await handler(request)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        except Edge0Error as exc:
            status, code = status_of(exc)
            log.info("server.request_failed", path=path, status=status, error=str(exc))
            headers = exc.headers if isinstance(exc, RequestError) else None
            return error_response(
                path, status, str(exc), getattr(exc, "param", None), code, headers
            )
        except Exception as exc:  # the server keeps serving; the log has the traceback
            log.exception("server.internal_error", path=path)
            return error_response(path, 500, f"internal error: {type(exc).__name__}: {exc}")

    route.__name__ = handler.__name__
    return route


async def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object. Refuses a body over the server's `max_body` (413: at
    once from its Content-Length, else once counted), one not received within the body
    timeout (408) and JSON beyond edge0.server.jsonbody's limits (400). Large bodies parse
    off the loop."""
    state = request.app.state
    limit, timeout = state.max_body, state.limits.body_timeout
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and (len(length) > 18 or int(length) > limit):
        refused(request, "too_large")
        raise _too_large(length if len(length) <= 18 else f"a {len(length)}-digit number of", limit)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    refused(request, "too_large")
                    raise _too_large(f"{size}+", limit)
                chunks.append(chunk)
    except ClientDisconnect:  # the client went away mid-upload: nobody to answer
        log.info("server.client_gone", path=request.url.path, received=size)
        raise ClientGone() from None
    except TimeoutError:
        refused(request, "body_timeout")
        raise RequestError(
            f"the request body did not arrive within {timeout:g} s ({size} bytes came); send it "
            "at once (`edge0 serve --body-timeout`)",
            status=408,
            code="request_timeout",
        ) from None
    body = b"".join(chunks)
    if len(body) <= INLINE_PARSE:
        return parse_object(body)
    return await asyncio.to_thread(parse_object, body)


def refused(request: Request, reason: str) -> None:
    """Count a refusal by a limit in the server's metrics."""
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.refusals.labels(reason=reason).inc()


def _too_large(size: str, limit: int) -> RequestError:
    return RequestError(
        f"the request body is {size} bytes; this server takes at most {limit} "
        "(`edge0 serve --max-body`)",
        status=413,
        code="request_too_large",
    )


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _drain(request: Request) -> Drain | None:
    return getattr(request.app.state, "drain", None)


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it at once if the client disconnects first (ClientGone) or the
    server's shutdown grace runs out first (a 503 RequestError).

    Call it only after the body has been read: it consumes the request's receive channel.
    """
    drain = _drain(request)
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    cut = asyncio.ensure_future(drain.cut.wait()) if drain is not None else None
    try:
        await asyncio.wait(
            {task, watch} | ({cut} if cut else set()), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for waiter in (watch, cut):
            if waiter is not None:
                waiter.cancel()
        if not task.done():
            task.cancel()  # the request's generator unwinds and releases the engine
        await asyncio.gather(*(f for f in (task, watch, cut) if f), return_exceptions=True)
    if task.cancelled():
        if drain is not None and drain.cut.is_set() and not _saw_disconnect(watch):
            raise drain.error()
        raise ClientGone()
    return task.result()


def _saw_disconnect(watch: asyncio.Future[None]) -> bool:
    """Whether the disconnect watcher saw the client go (not merely cancelled)."""
    return watch.done() and not watch.cancelled() and watch.exception() is None


async def _until_cut(it: AsyncGenerator[str, None], drain: Drain) -> AsyncGenerator[str, None]:
    """`it`, ending with the drain's 503 error once the shutdown grace has run out."""
    try:
        async for piece in it:
            yield piece
            if drain.cut.is_set():  # checked between pieces: at most one decode step late
                raise drain.error()
    finally:
        await it.aclose()


async def open_stream(request: Request, gen: Any) -> tuple[str | None, AsyncGenerator[str, None]]:
    """Start a generation's `deltas()` and wait for its first piece (None: no text at all).

    Errors before the first token (a bad prompt, a tier error in prefill) raise here,
    so they are answered with a status code and an error body, not inside the stream.
    """
    it: AsyncGenerator[str, None] = gen.deltas()
    try:
        first = await unless_disconnected(request, anext(it, None))
    except BaseException:
        await it.aclose()
        raise
    drain = _drain(request)
    return first, (it if drain is None else _until_cut(it, drain))
