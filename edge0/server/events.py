"""`GET /v1/edge0/events`: the engine's steps as server-sent events, each listener bounded
(docs/server.md, "The event stream").

The compute thread queues one raw trace per step; the first of a window wakes the event loop
(call_soon_threadsafe), which FLUSH_S later sums up every queued step once and offers them, as
one encoded `steps` event, to every listener. A listener whose
backlog reaches `limit` events is dropped (a last `dropped` event, then the stream ends):
a slow reader never slows decoding. With no listener the feed is detached and the compute
thread does no work for it.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from edge0.log import get_logger
from edge0.runtime.compute.live import LiveFeed, StepTrace
from edge0.runtime.engine.api import Engine
from edge0.server.drain import Drain
from edge0.server.metrics import Finished
from edge0.server.timeline import Timeline

log = get_logger("edge0.server.events")
PATH = "/v1/edge0/events"
BACKLOG = 256  # events a listener may leave unread before it is dropped
FLUSH_S = 0.1  # queued steps reach the listeners together, this long after the first
QUEUED = 4096  # steps kept for the loop at most (a stalled loop loses the oldest, never blocks)


class Listener:
    """One open event stream: its unread events, bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending: deque[tuple[str, str]] = deque()  # (event, data)
        self.dropped = False
        self.closed = False
        self.wake = asyncio.Event()

    def offer(self, event: str, data: str) -> None:
        if self.dropped or self.closed:
            return
        if len(self.pending) >= self.limit:
            self.dropped = True
            self.pending.clear()
        else:
            self.pending.append((event, data))
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()


class EventHub:
    """The listeners of one engine's event stream; attaches the live feed while there are any."""

    def __init__(self, engine: Engine, info: dict[str, Any], limit: int = BACKLOG) -> None:
        self.engine = engine
        self.info = info  # the `engine` event each listener gets first
        self.limit = limit
        self.listeners: set[Listener] = set()
        self.dropped = 0  # listeners dropped for reading too slowly
        self.timeline = Timeline()
        self._loop = asyncio.get_running_loop()
        self._traces: deque[StepTrace] = deque(maxlen=QUEUED)  # handed over, not published
        self._waking = False  # a flush is scheduled
        setup = engine.setup
        self.feed = LiveFeed(setup.ctx, setup.tracer, self._hand_over)

    def _hand_over(self, trace: StepTrace) -> None:
        """On the compute thread: queue the trace; the first of a window wakes the loop."""
        self._traces.append(trace)
        if not self._waking:
            self._waking = True
            self._loop.call_soon_threadsafe(self._loop.call_later, FLUSH_S, self.flush)

    def subscribe(self) -> Listener:
        listener = Listener(self.limit)
        listener.offer("engine", json.dumps(self.info))
        if not self.listeners:
            self.timeline = Timeline()
            self._traces.clear()
            self.feed.attach()
        self.listeners.add(listener)
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        self.listeners.discard(listener)
        if not self.listeners:
            self.feed.detach()

    def close(self) -> None:
        """The server is stopping: every stream ends."""
        for listener in list(self.listeners):
            listener.close()
        self.feed.detach()

    def publish(self, event: str, payload: Any) -> None:
        data = json.dumps(payload, separators=(",", ":"))
        for listener in list(self.listeners):
            listener.offer(event, data)
            if listener.dropped:
                self.dropped += 1
                log.info("events.listener_dropped", backlog=self.limit)
                self.unsubscribe(listener)

    def flush(self) -> None:
        """Publish the queued steps (on the loop): one `steps` event."""
        self._waking = False  # before draining: a trace queued from now on schedules a flush
        traces = []
        while self._traces:
            traces.append(self._traces.popleft())
        if traces and self.listeners:
            self.publish("steps", [self.timeline.event(t) for t in traces])

    def finished(self, gen: Finished) -> None:
        """A generation ended: its usage and, when it ran to its end, the stats line."""
        if not self.listeners:
            return
        self.flush()  # the generation's last steps come before its `done`
        stats = gen.stats
        self.publish(
            "done",
            {
                "api": gen.api,
                "finish_reason": gen.finish_reason,
                "prompt_tokens": gen.prompt_tokens,
                "completion_tokens": gen.completion_tokens,
                "line": stats.line() if stats is not None else None,
                "stats": stats.to_dict() if stats is not None else None,
            },
        )


def engine_info(engine: Engine, model_id: str) -> dict[str, Any]:
    """The `engine` event: what runs, in which mode, within which memory plan."""
    setup = engine.setup
    sched = setup.reads
    plan = setup.memory_plan
    return {
        "model": model_id,
        "mode": setup.ctx.mode,
        "exactness": setup.exactness,
        "top_k": setup.ctx.top_k,
        "predictor": getattr(setup.ctx.predictor, "name", "") or None,
        "tiers": str(engine.options.tiers),
        "max_batch": engine.options.max_batch,
        "streamed_layers": sorted(setup.ctx.layers),
        "slots": sched.table.n_slots if sched is not None else 0,
        "memory_plan": plan.line() if plan is not None else None,
        "backlog": BACKLOG,
    }


async def _stream(hub: EventHub, listener: Listener) -> AsyncIterator[dict[str, str]]:
    try:
        while True:
            await listener.wake.wait()
            listener.wake.clear()
            while listener.pending:
                event, data = listener.pending.popleft()
                yield {"event": event, "data": data}
            if listener.dropped:
                reason = f"this listener left {hub.limit} events unread and was dropped"
                yield {"event": "dropped", "data": json.dumps({"reason": reason})}
                return
            if listener.closed:
                yield {"event": "end", "data": json.dumps({"reason": "the server is stopping"})}
                return
    finally:
        hub.unsubscribe(listener)


async def events(request: Request) -> Response:
    """The event stream of the engine's steps (text/event-stream)."""
    hub: EventHub = request.app.state.events
    drain: Drain | None = getattr(request.app.state, "drain", None)
    if drain is not None and drain.stopping:
        listener = Listener(hub.limit)
        listener.close()
    else:
        listener = hub.subscribe()
    return EventSourceResponse(_stream(hub, listener), ping=15, sep="\n")
