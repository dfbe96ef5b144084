"""Request bodies of the OpenAI and Anthropic APIs, checked field by field into small attrs classes.

Fields outside the APIs are ignored (clients send many); a known field of the wrong
type or out of range, or a feature Edge0 does not serve (edge0.server.fields), is a
RequestError naming the field.
"""

from __future__ import annotations

from typing import Any

import attrs

from edge0.errors import RequestError
from edge0.server.field_errors import bad as _bad
from edge0.server.field_errors import missing
from edge0.server.fields import refuse_unserved
from edge0.server.messages import Message, anthropic_messages, openai_messages
from edge0.server.tool_fields import ToolUse, anthropic_tool_use, openai_tool_use, response_format

MAX_STOP = 16  # stop strings per request


@attrs.frozen
class Sampling:
    """How one request samples and when it stops (None max_tokens: up to the context)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@attrs.frozen
class TextRequest:
    """A parsed request: a prompt (text or ids) or chat messages, and how to sample."""

    model: str
    sampling: Sampling
    prompt: str | list[int] | None = None  # /v1/completions
    messages: tuple[Message, ...] = ()  # chat: system first when there is one
    stream: bool = False
    include_usage: bool = False  # OpenAI stream_options.include_usage
    tools: ToolUse = ToolUse()
    json_schema: dict[str, Any] | None = None  # the answer must be JSON valid against it
    logprobs: int | None = None  # None: off; else how many alternatives per token
    n: int = 1  # choices, decoded as a batch


# --- field readers ---------------------------------------------------------------------------
def _int(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, "an integer", value)
    if not lo <= value <= hi:
        raise RequestError(f"`{name}` must be between {lo} and {hi}, got {value}", param=name)
    return value


def _float(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(name, "a number", value)
    if not lo <= value <= hi:  # also refuses NaN
        raise RequestError(f"`{name}` must be between {lo} and {hi}, got {value}", param=name)
    return float(value)


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(name, "true or false", value)
    return value


def _str(body: dict[str, Any], name: str, required: bool = False) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise (missing(name) if value is None else _bad(name, "a string", value))
    return value


def _stops(body: dict[str, Any], name: str, single_ok: bool) -> tuple[str, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if single_ok and isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise _bad(name, "a list of non-empty strings" + (" or a string" * single_ok), value)
    if len(value) > MAX_STOP:
        raise RequestError(f"`{name}` has {len(value)} entries; at most {MAX_STOP}", param=name)
    return tuple(value)


MAX_N = 8  # choices per request (each decodes as one request of the batch)
MAX_TOP_LOGPROBS = 20


def _openai_common(body: dict[str, Any], api: str) -> dict[str, Any]:
    refuse_unserved(body, api)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("stream_options", "an object", opts)
    return {
        "model": _str(body, "model"),
        "stream": _bool(body, "stream"),
        "include_usage": _bool(opts or {}, "include_usage"),
        "n": _int(body, "n", 1, 1, MAX_N),
    }


def _openai_sampling(body: dict[str, Any], max_tokens: int | None) -> Sampling:
    return Sampling(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_float(body, "top_p", 1.0, 0.0, 1.0),
        seed=_int(body, "seed", None, -(1 << 63), (1 << 64) - 1),
        stop=_stops(body, "stop", single_ok=True),
    )


# --- OpenAI ----------------------------------------------------------------------------------
def completion_request(body: dict[str, Any]) -> TextRequest:
    """POST /v1/completions: `prompt` is a string, a list of token ids, or a list of one."""
    common = _openai_common(body, "openai.completions")
    logprobs = _int(body, "logprobs", None, 0, 5)  # the top alternatives per token
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt
        ):
            raise _bad("prompt", "a string or a non-empty list of token ids (one prompt)", prompt)
    elif not isinstance(prompt, str):
        raise (
            missing("prompt")
            if prompt is None
            else _bad("prompt", "a string or a list of token ids", prompt)
        )
    max_tokens = _int(body, "max_tokens", 16, 1, 1 << 30)
    return TextRequest(
        sampling=_openai_sampling(body, max_tokens), prompt=prompt, logprobs=logprobs, **common
    )


def chat_request(body: dict[str, Any]) -> TextRequest:
    """POST /v1/chat/completions."""
    common = _openai_common(body, "openai.chat")
    messages = openai_messages(body)
    max_tokens = _int(body, "max_completion_tokens", None, 1, 1 << 30)
    max_tokens = _int(body, "max_tokens", max_tokens, 1, 1 << 30)
    top = _int(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not body.get("logprobs"):
        raise RequestError("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
    logprobs = (top or 0) if _bool(body, "logprobs") else None
    tools = openai_tool_use(body)
    schema = response_format(body)
    if schema is not None and tools.forced():
        raise RequestError(
            "`response_format` and a `tool_choice` that forces a tool cannot "
            "both shape the answer; send one",
            param="response_format",
        )
    return TextRequest(
        sampling=_openai_sampling(body, max_tokens),
        messages=tuple(messages),
        tools=tools,
        json_schema=schema,
        logprobs=logprobs,
        **common,
    )


# --- Anthropic -------------------------------------------------------------------------------
def messages_request(body: dict[str, Any]) -> TextRequest:
    """POST /v1/messages (Anthropic): `max_tokens` and `model` are required."""
    if body.get("max_tokens") is None:
        raise missing("max_tokens")
    refuse_unserved(body, "anthropic.messages")
    messages = anthropic_messages(body)
    sampling = Sampling(
        max_tokens=_int(body, "max_tokens", None, 1, 1 << 30),
        temperature=_float(body, "temperature", 1.0, 0.0, 1.0),
        top_p=_float(body, "top_p", 1.0, 0.0, 1.0),
        top_k=_int(body, "top_k", 0, 0, 1 << 30) or 0,
        stop=_stops(body, "stop_sequences", single_ok=False),
    )
    return TextRequest(
        model=_str(body, "model", required=True),
        sampling=sampling,
        messages=tuple(messages),
        stream=_bool(body, "stream"),
        tools=anthropic_tool_use(body),
    )
