"""The ASGI app of `edge0 serve`: routes, API-key check, and the engine opened in its lifespan.

The engine lives in the server's own event loop: the lifespan opens it before
the first request and closes it at shutdown. Requests queue for it first-come
first-served, at most `--max-queue` of them (edge0.server.admission); up to
`--max-batch` decode together (edge0.runtime.engine.batcher); each route runs as a task
of that loop, whose default executor (bodies, prompts, grammars) has a few threads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
from sse_starlette.sse import AppStatus
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from edge0.log import get_logger
from edge0.runtime.engine.api import Engine
from edge0.server import anthropic_api, openai_api, page
from edge0.server.backend import Backend
from edge0.server.drain import Drain
from edge0.server.events import PATH as EVENTS_PATH
from edge0.server.events import EventHub, engine_info, events
from edge0.server.http import api_route, error_response
from edge0.server.idle import WORKER_THREADS, IdleTrim, give_back
from edge0.server.limits import Limits
from edge0.server.metrics import CONTENT_TYPE, CountResponses, ServerMetrics
from edge0.server.prompt_bound import token_bound

log = get_logger("edge0.server")
MAX_BODY = 1 << 20  # bytes of JSON per request


@attrs.frozen
class ServerConfig:
    """What `create_app` serves and how (the flags of `edge0 serve`)."""

    model: Path
    engine: dict[str, Any] = attrs.field(factory=dict)  # Engine.open keyword arguments
    model_id: str = "edge0"
    api_key: str | None = None  # required on every route when set
    max_body: int = MAX_BODY
    limits: Limits = Limits()  # connections, timeouts, queue (edge0.server.limits)
    on_ready: Callable[[Engine], None] | None = None  # called once the engine is open
    drain: Drain = attrs.field(factory=Drain)  # shared with the DrainingServer that runs it


class ApiKeyMiddleware:
    """Refuses requests without the key: `Authorization: Bearer KEY` or `x-api-key: KEY`."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _given_key(dict(scope["headers"]))
        if given and hmac.compare_digest(given, self.key):
            await self.app(scope, receive, send)
            return
        what = "a wrong API key" if given else "no API key"
        response = error_response(
            scope["path"],
            401,
            f"the request has {what}; send it as `Authorization: Bearer KEY` or `x-api-key: KEY` "
            "(a browser: as the password it asks for)",
            code="invalid_api_key",
            headers={"www-authenticate": 'Basic realm="edge0", charset="UTF-8"'},
        )
        await response(scope, receive, send)


def _given_key(headers: dict[bytes, bytes]) -> bytes:
    """The key a request sends: `x-api-key`, a bearer token, or a browser's Basic password."""
    given = headers.get(b"x-api-key", b"")
    auth = headers.get(b"authorization", b"")
    if auth[:7].lower() == b"bearer ":
        given = auth[7:].strip()
    elif auth[:6].lower() == b"basic ":
        try:
            given = base64.b64decode(auth[6:].strip(), validate=True).partition(b":")[2]
        except binascii.Error:
            given = b""
    return given


async def health(request: Request) -> Response:
    backend: Backend = request.app.state.backend
    return JSONResponse(
        {"status": "ok", "model": backend.model_id, "requests_in_flight": backend.metrics.active}
    )


async def metrics(request: Request) -> Response:
    backend: Backend = request.app.state.backend
    return Response(backend.metrics.render(), media_type=CONTENT_TYPE)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    path = request.url.path
    message = {404: f"no route {path}", 405: f"{request.method} is not allowed on {path}"}
    return error_response(path, exc.status_code, message.get(exc.status_code, str(exc.detail)))


def create_app(config: ServerConfig) -> Starlette:
    """The app; the engine opens when the server runs its lifespan."""
    server_metrics = ServerMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(WORKER_THREADS, "edge0-serve"))
        try:
            async with Engine.open(config.model, **config.engine) as engine:
                bound = await asyncio.to_thread(token_bound, engine.tokenizer)
                app.state.backend = Backend(
                    engine, config.model_id, server_metrics, config.limits, bound
                )

                async def trimmed() -> None:
                    server_metrics.heap_trims.inc()
                    await give_back(engine)

                trim = IdleTrim(lambda: server_metrics.http_active == 0, trimmed)
                server_metrics.on_idle = trim.soon
                hub = app.state.events = EventHub(engine, engine_info(engine, config.model_id))
                server_metrics.on_finished = hub.finished
                config.drain.on_stop.append(hub.close)
                log.info("server.ready", model=str(config.model), model_id=config.model_id)
                if config.on_ready is not None:
                    config.on_ready(engine)
                yield
                hub.close()
                server_metrics.on_idle = server_metrics.on_finished = None
                await trim.close()  # before the engine closes
        except BaseException as exc:
            if getattr(app.state, "backend", None) is None:  # `edge0 serve` reports it
                app.state.startup_error = exc
            raise
        log.info("server.closed")

    routes = [
        Route("/health", api_route(health), methods=["GET"]),
        Route("/metrics", api_route(metrics), methods=["GET"]),
        Route(EVENTS_PATH, api_route(events), methods=["GET"]),
        *openai_api.ROUTES,
        *anthropic_api.ROUTES,
        *page.routes(page.load()),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
    )
    app.state.max_body = config.max_body
    app.state.limits = config.limits
    app.state.metrics = server_metrics
    app.state.drain = config.drain
    # streams end through the drain (a last event in the API's shape), not by sse-starlette
    # cancelling them the moment shutdown begins
    AppStatus.disable_automatic_graceful_drain()
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, key=config.api_key)
    app.add_middleware(  # outermost
        CountResponses,
        metrics=server_metrics,
        routes=routes,
        watching=frozenset({EVENTS_PATH}),
    )
    return app
