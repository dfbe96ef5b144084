"""OpenAI routes: /v1/models, /v1/completions and /v1/chat/completions (JSON or SSE chunks)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge0.errors import RequestError
from edge0.server import schemas
from edge0.server.answer import Answer, Choice, Event
from edge0.server.backend import Backend
from edge0.server.decoding import TokenLogprob
from edge0.server.http import (
    api_route,
    error_body,
    open_stream,
    read_json,
    stream_error,
    unless_disconnected,
)
from edge0.server.tool_fields import ToolCall

FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def _usage(answer: Answer) -> dict[str, int]:
    prompt, completion = answer.prompt_tokens, answer.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _model_card(model_id: str, created: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "edge0"}


async def models(request: Request) -> Response:
    b = _backend(request)
    return JSONResponse({"object": "list", "data": [_model_card(b.model_id, b.created)]})


async def model(request: Request) -> Response:
    b = _backend(request)
    if request.path_params["model"] != b.model_id:
        raise RequestError(
            f"no model {request.path_params['model']!r}; this server serves {b.model_id!r}",
            status=404,
            param="model",
        )
    return JSONResponse(_model_card(b.model_id, b.created))


def _token(tokenizer: Any, token: int) -> tuple[str, list[int]]:
    text = tokenizer.decode([token])
    return text, list(text.encode("utf-8", "surrogatepass"))


class _Shape:
    """What differs between text completions and chat completions."""

    def __init__(self, chat: bool, model_id: str, tokenizer: Any, top: int | None) -> None:
        self.chat = chat
        self.tokenizer = tokenizer
        self.top = top  # None: no logprobs asked for
        self.base = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model_id,
        }
        self.offset: dict[int, int] = {}  # completions' text_offset, per choice

    def logprobs(self, index: int, lps: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> Any:
        """The `logprobs` of a choice (or chunk) in the route's shape; None when not asked."""
        if self.top is None:
            return None
        tok = self.tokenizer
        if self.chat:

            def entry(t: int, lp: float) -> dict[str, Any]:
                text, raw = _token(tok, t)
                return {"token": text, "logprob": lp, "bytes": raw}

            return {
                "content": [
                    {**entry(r.token, r.logprob), "top_logprobs": [entry(t, v) for t, v in r.top]}
                    for r in lps
                ],
                "refusal": None,
            }
        tokens = [_token(tok, r.token)[0] for r in lps]
        offsets = []
        for text in tokens:
            offsets.append(self.offset.get(index, 0))
            self.offset[index] = offsets[-1] + len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [r.logprob for r in lps],
            "top_logprobs": [{_token(tok, t)[0]: v for t, v in r.top} for r in lps],
            "text_offset": offsets,
        }

    def whole(self, answer: Answer, choices: list[Choice]) -> dict[str, Any]:
        out = []
        for c in choices:
            finish = FINISH.get(answer.finish(c.index), answer.finish(c.index))
            choice: dict[str, Any] = {
                "index": c.index,
                "finish_reason": finish,
                "logprobs": self.logprobs(c.index, c.logprobs),
            }
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": c.text}
                if c.calls:
                    message["content"] = c.text or None
                    message["tool_calls"] = [_call(call) for call in c.calls]
                choice["message"] = message
            else:
                choice["text"] = c.text
            out.append(choice)
        return {**self.base, "choices": out, "usage": _usage(answer)}

    def chunk(
        self, index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
    ) -> str:
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish}
        if self.chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta.get("content") or ""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return json.dumps({**self.base, "object": obj, "choices": [choice]})

    def usage_chunk(self, answer: Answer) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return json.dumps({**self.base, "object": obj, "choices": [], "usage": _usage(answer)})


def _call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json()},
    }


async def _events(
    shape: _Shape,
    answer: Answer,
    first: Event | None,
    rest: AsyncGenerator[Event, None],
    include_usage: bool,
    path: str,
) -> AsyncIterator[str]:
    calls: dict[int, int] = {}  # tool calls streamed per choice
    try:
        if shape.chat:  # the role comes first, as OpenAI sends it
            for i in range(len(answer.gens)):
                yield shape.chunk(i, {"role": "assistant", "content": ""})
        events = [first] if first is not None else []
        while True:
            for e in events:
                lps = shape.logprobs(e.index, e.logprobs) if e.logprobs else None
                if e.kind == "text" and e.text:
                    yield shape.chunk(e.index, {"content": e.text}, logprobs=lps)
                elif e.kind == "call" and e.call is not None:
                    k = calls[e.index] = calls.get(e.index, -1) + 1
                    yield shape.chunk(e.index, {"tool_calls": [{"index": k, **_call(e.call)}]})
                elif e.kind == "end":
                    finish = answer.finish(e.index)
                    yield shape.chunk(e.index, {}, FINISH.get(finish, finish), lps)
            e_next = await anext(rest, None)
            if e_next is None:
                break
            events = [e_next]
        if include_usage:
            yield shape.usage_chunk(answer)
        yield "[DONE]"
    except Exception as exc:  # a failure after the first token: the error is the last event
        status, code, message = stream_error(exc, path)
        yield json.dumps(error_body(path, status, message, code=code))
    finally:
        await rest.aclose()


async def _serve(request: Request, chat: bool) -> Response:
    backend = _backend(request)
    body = await read_json(request)
    req = schemas.chat_request(body) if chat else schemas.completion_request(body)
    api = "openai.chat" if chat else "openai.completions"
    tok = backend.engine.tokenizer
    answer = Answer(await backend.start(api, req), req.tools, tok, "call_")
    shape = _Shape(chat, backend.model_id, tok, req.logprobs)
    if not req.stream:
        choices = await unless_disconnected(request, answer.whole())
        return JSONResponse(shape.whole(answer, choices))
    first, rest = await open_stream(request, answer)
    events = _events(
        shape,
        answer,
        cast(Event | None, first),
        cast(AsyncGenerator[Event, None], rest),
        req.include_usage,
        request.url.path,
    )
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
