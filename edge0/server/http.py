"""HTTP plumbing of the server: bounded JSON bodies, client-disconnect watching, error bodies.

Errors take the shape of the API the route belongs to: OpenAI's
`{"error": {"message", "type", "param", "code"}}` everywhere but `/v1/messages`,
which answers Anthropic's `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge0.errors import ConfigError, Edge0Error, PromptError, RequestError, TierReadError
from edge0.log import get_logger

log = get_logger("edge0.server")
T = TypeVar("T")
ANTHROPIC_PREFIX = "/v1/messages"
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the logs do

_OPENAI_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
                 404: "invalid_request_error", 405: "invalid_request_error",
                 413: "invalid_request_error", 503: "server_error"}  # fmt: skip
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    404: "not_found_error", 405: "invalid_request_error",
                    413: "request_too_large", 503: "overloaded_error"}  # fmt: skip


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


def error_body(path: str, status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The error object of the API that serves `path`."""
    if path.startswith(ANTHROPIC_PREFIX):
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(path: str, status: int, message: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:  # fmt: skip
    return JSONResponse(error_body(path, status, message, param, code), status_code=status)


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
            backend = getattr(request.app.state, "backend", None)
            if backend is not None:
                backend.metrics.error_response(status)
            log.info("server.request_failed", path=path, status=status, error=str(exc))
            return error_response(path, status, str(exc), getattr(exc, "param", None), code)
        except Exception as exc:  # the server keeps serving; the log has the traceback
            log.exception("server.internal_error", path=path)
            return error_response(path, 500, f"internal error: {type(exc).__name__}: {exc}")

    route.__name__ = handler.__name__
    return route


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object, refusing bodies over `limit` bytes (413)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(int(length), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.strip():
        raise RequestError("the request body is empty; send a JSON object")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, not {type(data).__name__}")
    return data


def _too_large(size: int, limit: int) -> RequestError:
    return RequestError(
        f"the request body is {size}+ bytes; this server takes at most {limit} "
        "(`edge0 serve --max-body`)", status=413,
    )  # fmt: skip


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it at once if the client disconnects first (ClientGone).

    Call it only after the body has been read: it consumes the request's receive channel.
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()  # the request's generator unwinds and releases the engine
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()


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
    return first, it
