"""Anthropic route: POST /v1/messages, one text block, JSON or the Messages streaming events.

Stream: message_start, content_block_start, ping, content_block_delta per piece,
content_block_stop, message_delta (stop reason, output tokens), message_stop; a
failure after the first token ends it with an `error` event.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge0.server import schemas
from edge0.server.backend import Backend, Generation
from edge0.server.http import (
    api_route,
    error_body,
    open_stream,
    read_json,
    stream_error,
    unless_disconnected,
)

STOP_REASON = {"stop": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens"}


def _message(gen: Generation, model_id: str, msg_id: str, content: list[dict[str, Any]],
             done: bool) -> dict[str, Any]:  # fmt: skip
    return {
        "id": msg_id, "type": "message", "role": "assistant", "model": model_id,
        "content": content,
        "stop_reason": STOP_REASON.get(gen.finish_reason, gen.finish_reason) if done else None,
        "stop_sequence": gen.stop_sequence if done else None,
        "usage": {"input_tokens": gen.prompt_tokens,
                  "output_tokens": gen.completion_tokens if done else 0},
    }  # fmt: skip


def _event(kind: str, **data: Any) -> ServerSentEvent:
    return ServerSentEvent(event=kind, data=json.dumps({"type": kind, **data}))


async def _events(
    gen: Generation, model_id: str, msg_id: str, first: str | None,
    rest: AsyncGenerator[str, None], path: str,
) -> AsyncIterator[ServerSentEvent]:  # fmt: skip
    def delta(text: str) -> ServerSentEvent:
        return _event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})

    try:
        yield _event("message_start", message=_message(gen, model_id, msg_id, [], done=False))
        yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
        yield _event("ping")
        if first is not None:
            yield delta(first)
        async for piece in rest:
            yield delta(piece)
        yield _event("content_block_stop", index=0)
        yield _event("message_delta",
                     delta={"stop_reason": STOP_REASON.get(gen.finish_reason, gen.finish_reason),
                            "stop_sequence": gen.stop_sequence},
                     usage={"output_tokens": gen.completion_tokens})  # fmt: skip
        yield _event("message_stop")
    except Exception as exc:  # a failure after the first token: the error is the last event
        status, _, message = stream_error(exc, path)
        body = error_body(path, status, message)
        yield ServerSentEvent(event="error", data=json.dumps(body))
    finally:
        await rest.aclose()


@api_route
async def messages(request: Request) -> Response:
    backend: Backend = request.app.state.backend
    body = await read_json(request, request.app.state.max_body)
    req = schemas.messages_request(body)
    gen = await backend.start("anthropic.messages", req)
    msg_id = f"msg_{uuid.uuid4().hex}"
    if not req.stream:
        text = await unless_disconnected(request, gen.text())
        content = [{"type": "text", "text": text}]
        return JSONResponse(_message(gen, backend.model_id, msg_id, content, done=True))
    first, rest = await open_stream(request, gen)
    events = _events(gen, backend.model_id, msg_id, first, rest, request.url.path)
    return EventSourceResponse(events, ping=15, sep="\n")


ROUTES = [Route("/v1/messages", messages, methods=["POST"])]
