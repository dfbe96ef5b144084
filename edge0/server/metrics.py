"""`GET /metrics`: response, request, token and engine figures in the Prometheus text format.

Counters add up over the server's life; the `_last` gauges are the engine's
RunStats of the most recent finished request (decode tok/s, blocked load,
bytes per token, hit rates). Each server has its own registry. `CountResponses`,
the app's outermost middleware, counts every HTTP response by route, method and
status: 401s, 404s, 405s and 5xx included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge0.runtime.engine.summary import RunStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # the route label of paths no route serves (bounded label values)
CONNECTION_ROUTE = "connection"  # the route label of answers given before any route was reached
REFUSALS = ("connections", "header_timeout", "body_timeout", "too_large", "bad_http", "queue_full")
_LATENCY = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Finished(Protocol):
    """What the metrics read of a finished generation (edge0.server.generation.Generation)."""

    @property
    def api(self) -> str: ...

    @property
    def finish_reason(self) -> str: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def started(self) -> float: ...

    @property
    def first_token_s(self) -> float | None: ...

    @property
    def stats(self) -> RunStats | None: ...


class ServerMetrics:
    """The server's Prometheus collectors."""

    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry()
        self.active = 0  # generations started and not finished
        self.http_active = 0  # HTTP requests in the app (streams until their last event)
        self.on_idle: Callable[[], None] | None = None  # called when none is left
        self.on_finished: Callable[[Finished], None] | None = None  # after each generation
        ProcessCollector(registry=reg)  # process_resident_memory_bytes, cpu seconds, fds
        self.requests = Counter(
            "edge0_requests",
            "Generation requests by API and outcome "
            "(stop, length, stop_sequence, cancelled, error).",
            ["api", "outcome"],
            registry=reg,
        )
        self.responses = Counter(
            "edge0_http_responses",
            "HTTP responses by route (the "
            "route's path template, or 'unmatched'), method (or 'other') "
            "and status.",
            ["route", "method", "status"],
            registry=reg,
        )
        self.errors = Counter(
            "edge0_error_responses",
            "HTTP responses with status 400 or above, by status.",
            ["status"],
            registry=reg,
        )
        self.in_flight = Gauge(
            "edge0_requests_in_flight",
            "Requests generating (holding a place of the engine's batch).",
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "edge0_prompt_tokens", "Prompt tokens of served requests.", registry=reg
        )
        self.completion_tokens = Counter(
            "edge0_completion_tokens", "Tokens generated.", registry=reg
        )
        self.decode_steps = Counter(
            "edge0_decode_steps",
            "Decode steps (tokens after the first of each request).",
            registry=reg,
        )
        self.decode_seconds = Counter(
            "edge0_decode_seconds", "Seconds spent in decode steps.", registry=reg
        )
        self.tier_errors = Counter(
            "edge0_tier_errors", "Requests ended by a storage-tier read error.", registry=reg
        )
        self.failed_reads = Counter(
            "edge0_failed_reads", "Expert reads that failed (tickets).", registry=reg
        )
        self.ttft = Histogram(
            "edge0_time_to_first_token_seconds",
            "Request arrival to first generated token.",
            buckets=_LATENCY,
            registry=reg,
        )
        self.duration = Histogram(
            "edge0_request_seconds", "Request arrival to its end.", buckets=_LATENCY, registry=reg
        )
        self.refusals = Counter(
            "edge0_refused",
            "Requests and connections refused by a limit (docs/server.md, Limits), by reason: "
            + ", ".join(REFUSALS)
            + ".",
            ["reason"],
            registry=reg,
        )
        for reason in REFUSALS:  # every reason shows, at 0 until it happens
            self.refusals.labels(reason=reason)
        self.queue_depth = Gauge(
            "edge0_queue_depth",
            "Requests (one per choice) admitted and waiting for the engine.",
            registry=reg,
        )
        self.http_in_flight = Gauge(
            "edge0_http_requests_in_flight",
            "HTTP requests in the app (a stream until its last event).",
            registry=reg,
        )
        self.http_in_flight.set_function(lambda: self.http_active)
        self.heap_trims = Counter(
            "edge0_heap_trims",
            "Times the idle server gave freed memory back (MLX's cache, malloc_trim).",
            registry=reg,
        )
        self.queue_wait = Histogram(
            "edge0_queue_wait_seconds",
            "Time an admitted request waited for the engine (0 when a place was free).",
            buckets=(0.0, *_LATENCY),
            registry=reg,
        )

        def last(name: str, doc: str) -> Gauge:
            return Gauge(f"edge0_{name}_last", doc + " (last finished request).", registry=reg)

        self.decode_tps = last("decode_tokens_per_second", "Decode tokens per second")
        self.blocked = last(
            "blocked_load_ms_per_step", "Compute waiting on reads, ms per decode step"
        )
        self.bytes_per_token = last("bytes_per_token", "Expert bytes read per token")
        self.cache_hit = last("cache_hit_rate", "Reads served by a cache tier / all reads")
        self.slot_hit = last("slot_hit_rate", "Experts found staged when compute asked")

    def started(self) -> None:
        self.active += 1
        self.in_flight.inc()

    def response(self, route: str, method: str, status: int) -> None:
        method = method if method in METHODS else "other"
        self.responses.labels(route=route, method=method, status=str(status)).inc()
        if status >= 400:
            self.errors.labels(status=str(status)).inc()

    def refused(self, route: str, method: str, status: int, reason: str) -> None:
        """A refusal answered below the routes (the connection layer): its response and why."""
        self.response(route, method, status)
        self.refusals.labels(reason=reason).inc()
        if self.http_active == 0 and self.on_idle is not None:
            self.on_idle()

    def request_over(self) -> None:
        """An HTTP request ended; the last one in flight calls `on_idle`."""
        self.http_active -= 1
        if self.http_active == 0 and self.on_idle is not None:
            self.on_idle()

    def tier_error(self) -> None:
        self.tier_errors.inc()

    def finished(self, gen: Finished) -> None:
        """Account one finished (or cancelled, or failed) generation."""
        self.active -= 1
        self.in_flight.dec()
        self.requests.labels(api=gen.api, outcome=gen.finish_reason).inc()
        self.prompt_tokens.inc(gen.prompt_tokens)
        self.completion_tokens.inc(gen.completion_tokens)
        self.duration.observe(time.perf_counter() - gen.started)
        if gen.first_token_s is not None:
            self.ttft.observe(gen.first_token_s)
        if self.on_finished is not None:
            self.on_finished(gen)
        s = gen.stats
        if s is None:
            return
        self.decode_steps.inc(s.decode_steps)
        self.decode_seconds.inc(s.decode_s)
        self.failed_reads.inc(s.tickets_failed)
        self.decode_tps.set(s.decode_tps)
        self.blocked.set(s.blocked_ms_per_step)
        self.bytes_per_token.set(s.bytes_per_token)
        self.cache_hit.set(s.cache_hit_rate)
        self.slot_hit.set(s.slot_hit_rate)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountResponses:
    """ASGI middleware: counts each HTTP response into `metrics` as its status line goes out."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: ServerMetrics,
        routes: Sequence[BaseRoute],
        watching: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes
        self.watching = watching  # paths that stay open to watch (never in flight: idle trims)

    def route_of(self, scope: Scope) -> str:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:  # PARTIAL: the path matched, the method did not
                return str(getattr(route, "path", UNMATCHED))
        return UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and not status:
                status.append(int(message["status"]))
                self.metrics.response(self.route_of(scope), scope["method"], status[0])
            await send(message)

        counts = scope["path"] not in self.watching
        if counts:
            self.metrics.http_active += 1
        try:
            await self.app(scope, receive, counted)
        except Exception:  # starlette's outer handler answers 500: count it here
            if not status:
                self.metrics.response(self.route_of(scope), scope["method"], 500)
            raise
        finally:
            if counts:
                self.metrics.request_over()
