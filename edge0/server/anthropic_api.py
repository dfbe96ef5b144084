"""Anthropic route: POST /v1/messages, text and tool_use blocks, JSON or the streaming events.

Stream: message_start, ping, then per block content_block_start, its deltas
(`text_delta` per piece; one `input_json_delta` per tool call) and
content_block_stop; then message_delta (stop reason, output tokens) and
message_stop. A failure after the first token ends it with an `error` event.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge0.server import schemas
from edge0.server.answer import Answer, Event
from edge0.server.backend import Backend
from edge0.server.http import (
    api_route,
    error_body,
    open_stream,
    read_json,
    stream_error,
    unless_disconnected,
)
from edge0.server.tool_fields import ToolCall

STOP_REASON = {
    "stop": "end_turn",
    "stop_sequence": "stop_sequence",
    "length": "max_tokens",
    "tool_calls": "tool_use",
}


def _message(
    answer: Answer, model_id: str, msg_id: str, content: list[dict[str, Any]], done: bool
) -> dict[str, Any]:
    gen = answer.gens[0]
    reason = answer.finish(0)
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model_id,
        "content": content,
        "stop_reason": STOP_REASON.get(reason, reason) if done else None,
        "stop_sequence": gen.stop_sequence if done else None,
        "usage": {
            "input_tokens": gen.prompt_tokens,
            "output_tokens": gen.completion_tokens if done else 0,
        },
    }


def _input(call: ToolCall) -> dict[str, Any]:
    return call.arguments if isinstance(call.arguments, dict) else {}


def _event(kind: str, **data: Any) -> ServerSentEvent:
    return ServerSentEvent(event=kind, data=json.dumps({"type": kind, **data}))


async def _events(
    answer: Answer,
    model_id: str,
    msg_id: str,
    first: Event | None,
    rest: AsyncGenerator[Event, None],
    path: str,
) -> AsyncIterator[ServerSentEvent]:
    block = -1  # the open block's index
    text_open = False
    try:
        yield _event("message_start", message=_message(answer, model_id, msg_id, [], done=False))
        if first is None or first.kind != "call":  # a text block opens before the ping
            block, text_open = 0, True
            yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
        yield _event("ping")
        e: Event | None = first
        while e is not None:
            if e.kind == "text" and e.text:
                if not text_open:
                    block, text_open = block + 1, True
                    yield _event(
                        "content_block_start",
                        index=block,
                        content_block={"type": "text", "text": ""},
                    )
                yield _event(
                    "content_block_delta", index=block, delta={"type": "text_delta", "text": e.text}
                )
            elif e.kind == "call" and e.call is not None:
                if text_open:
                    yield _event("content_block_stop", index=block)
                    text_open = False
                block += 1
                yield _event(
                    "content_block_start",
                    index=block,
                    content_block={
                        "type": "tool_use",
                        "id": e.call.id,
                        "name": e.call.name,
                        "input": {},
                    },
                )
                yield _event(
                    "content_block_delta",
                    index=block,
                    delta={"type": "input_json_delta", "partial_json": json.dumps(_input(e.call))},
                )
                yield _event("content_block_stop", index=block)
            e = await anext(rest, None)
        if text_open:
            yield _event("content_block_stop", index=block)
        reason = answer.finish(0)
        yield _event(
            "message_delta",
            delta={
                "stop_reason": STOP_REASON.get(reason, reason),
                "stop_sequence": answer.gens[0].stop_sequence,
            },
            usage={"output_tokens": answer.completion_tokens},
        )
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
    body = await read_json(request)
    req = schemas.messages_request(body)
    tok = backend.engine.tokenizer
    answer = Answer(await backend.start("anthropic.messages", req), req.tools, tok, "toolu_")
    msg_id = f"msg_{uuid.uuid4().hex}"
    if not req.stream:
        (choice,) = await unless_disconnected(request, answer.whole())
        content: list[dict[str, Any]] = []
        if choice.text or not choice.calls:
            content.append({"type": "text", "text": choice.text})
        content += [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)}
            for c in choice.calls
        ]
        return JSONResponse(_message(answer, backend.model_id, msg_id, content, done=True))
    first, rest = await open_stream(request, answer)
    events = _events(
        answer,
        backend.model_id,
        msg_id,
        cast(Event | None, first),
        cast(AsyncGenerator[Event, None], rest),
        request.url.path,
    )
    return EventSourceResponse(events, ping=15, sep="\n")


ROUTES = [Route("/v1/messages", messages, methods=["POST"])]
