"""OpenAI routes: /v1/models, /v1/completions and /v1/chat/completions (JSON or SSE chunks)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge0.errors import RequestError
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

FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length"}


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def _usage(gen: Generation) -> dict[str, int]:
    return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens}  # fmt: skip


def _model_card(model_id: str, created: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "edge0"}


async def models(request: Request) -> Response:
    b = _backend(request)
    return JSONResponse({"object": "list", "data": [_model_card(b.model_id, b.created)]})


async def model(request: Request) -> Response:
    b = _backend(request)
    if request.path_params["model"] != b.model_id:
        raise RequestError(f"no model {request.path_params['model']!r}; this server "
                                   f"serves {b.model_id!r}", status=404, param="model")  # fmt: skip
    return JSONResponse(_model_card(b.model_id, b.created))


class _Shape:
    """What differs between text completions and chat completions."""

    def __init__(self, chat: bool, model_id: str) -> None:
        self.chat = chat
        self.base = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                     "object": "chat.completion" if chat else "text_completion",
                     "created": int(time.time()), "model": model_id}  # fmt: skip

    def whole(self, gen: Generation, text: str) -> dict[str, Any]:
        finish = FINISH.get(gen.finish_reason, gen.finish_reason)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self.base, "choices": [choice], "usage": _usage(gen)}

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False) -> str:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return json.dumps({**self.base, "object": obj, "choices": [choice]})

    def usage_chunk(self, gen: Generation) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return json.dumps({**self.base, "object": obj, "choices": [], "usage": _usage(gen)})


async def _events(
    shape: _Shape, gen: Generation, first: str | None, rest: AsyncGenerator[str, None],
    include_usage: bool, path: str,
) -> AsyncIterator[str]:  # fmt: skip
    try:
        if shape.chat:
            yield shape.chunk("", role=True)  # the role comes first, as OpenAI sends it
        if first is not None:
            yield shape.chunk(first)
        async for piece in rest:
            yield shape.chunk(piece)
        yield shape.chunk(None, FINISH.get(gen.finish_reason, gen.finish_reason))
        if include_usage:
            yield shape.usage_chunk(gen)
        yield "[DONE]"
    except Exception as exc:  # a failure after the first token: the error is the last event
        status, code, message = stream_error(exc, path)
        yield json.dumps(error_body(path, status, message, code=code))
    finally:
        await rest.aclose()


async def _serve(request: Request, chat: bool) -> Response:
    backend = _backend(request)
    body = await read_json(request, request.app.state.max_body)
    req = schemas.chat_request(body) if chat else schemas.completion_request(body)
    api = "openai.chat" if chat else "openai.completions"
    gen = await backend.start(api, req)
    shape = _Shape(chat, backend.model_id)
    if not req.stream:
        text = await unless_disconnected(request, gen.text())
        return JSONResponse(shape.whole(gen, text))
    first, rest = await open_stream(request, gen)
    events = _events(shape, gen, first, rest, req.include_usage, request.url.path)
    return EventSourceResponse(events, ping=15, sep="\n")


@api_route
async def completions(request: Request) -> Response:
    return await _serve(request, chat=False)


@api_route
async def chat_completions(request: Request) -> Response:
    return await _serve(request, chat=True)


ROUTES = [
    Route("/v1/models", api_route(models), methods=["GET"]),
    Route("/v1/models/{model:path}", api_route(model), methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
