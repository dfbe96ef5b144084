"""Every request field of both APIs (as the official SDKs define them) is honoured or refused.

The field lists come from the SDKs' request types, so a field a new SDK adds fails
here until edge0.server.fields places it. Each field is sent with a value that asks
for something: a served or accepted field gets an answer, a refused one a 400 that
names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic.types import message_create_params
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params
from server_helpers import TIERS, LiveServer, demo_model

from edge0.server.app import ServerConfig
from edge0.server.fields import ACCEPTED, REFUSED, SERVED

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
MSG = [{"role": "user", "content": "hi"}]
# a value that asks for something, per field (a dict: several fields sent together)
CHAT_PROBES: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"},
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [TOOL["function"]],
    "logit_bias": {"5": 10},
    "logprobs": True,
    "max_completion_tokens": 2,
    "max_tokens": 2,
    "messages": MSG,
    "metadata": {"k": "v"},
    "modalities": ["text", "audio"],
    "model": "any",
    "moderation": {"model": "m"},
    "n": 2,
    "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "x"},
    "presence_penalty": 0.5,
    "prompt_cache_key": "k",
    "prompt_cache_options": {"ttl": "5m"},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "json_object"},
    "safety_identifier": "u",
    "seed": 3,
    "service_tier": "auto",
    "stop": ["\n\n"],
    "store": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.5,
    "tool_choice": "none",
    "tools": [TOOL],
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "top_p": 0.5,
    "user": "u",
    "verbosity": "low",
    "web_search_options": {},
    "stream": True,
}
COMPLETION_PROBES: dict[str, Any] = {
    "best_of": 2,
    "echo": True,
    "frequency_penalty": 0.5,
    "logit_bias": {"5": 10},
    "logprobs": 2,
    "max_tokens": 2,
    "model": "any",
    "n": 2,
    "presence_penalty": 0.5,
    "prompt": "def",
    "seed": 3,
    "stop": ["\n\n"],
    "stream_options": {"include_usage": True},
    "suffix": "x",
    "temperature": 0.5,
    "top_p": 0.5,
    "user": "u",
    "stream": True,
}
MESSAGE_PROBES: dict[str, Any] = {
    "cache_control": {"type": "ephemeral"},
    "container": "c",
    "diagnostics": {"k": "v"},
    "inference_geo": "us",
    "max_tokens": 2,
    "messages": MSG,
    "metadata": {"user_id": "u"},
    "model": "any",
    "output_config": {"effort": "low"},
    "service_tier": "auto",
    "speed": "fast",
    "stop_sequences": ["\n\n"],
    "system": "Be brief.",
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "tool_choice": {"type": "auto"},
    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "user_profile_id": "u",
    "workspace_id": "w",
    "temperature": 0.5,
    "top_k": 5,
    "top_p": 0.5,
    "stream": True,
    "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}],
    "context_management": {"edits": []},
}
APIS = {
    "openai.chat": (
        "/v1/chat/completions",
        chat_create_params.CompletionCreateParamsBase,
        {"model": "m", "messages": MSG, "max_tokens": 2},
        CHAT_PROBES,
    ),
    "openai.completions": (
        "/v1/completions",
        completion_create_params.CompletionCreateParamsBase,
        {"model": "m", "prompt": "def", "max_tokens": 2},
        COMPLETION_PROBES,
    ),
    "anthropic.messages": (
        "/v1/messages",
        message_create_params.MessageCreateParamsBase,
        {"model": "m", "messages": MSG, "max_tokens": 2},
        MESSAGE_PROBES,
    ),
}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model: Path = demo_model(tmp_path_factory)
    config = ServerConfig(model=model, engine={"tiers": TIERS, "max_batch": 2})
    with LiveServer(config) as url:
        yield url


@pytest.mark.parametrize("api", list(APIS))
def test_every_sdk_field_has_a_place_and_a_probe(api: str) -> None:
    _, params, _, probes = APIS[api]
    sdk = set(params.__annotations__)
    placed = SERVED[api] | ACCEPTED[api] | set(REFUSED[api])
    assert sdk <= placed, f"{api}: place {sorted(sdk - placed)} in edge0.server.fields"
    assert placed <= set(probes), f"{api}: give {sorted(placed - set(probes))} a probe"
    assert not SERVED[api] & ACCEPTED[api] and not (SERVED[api] | ACCEPTED[api]) & set(REFUSED[api])


@pytest.mark.parametrize("api", list(APIS))
def test_every_field_is_honoured_or_refused(url: str, api: str) -> None:
    path, _, base, probes = APIS[api]
    answered, refused = [], []
    for name in sorted(SERVED[api] | ACCEPTED[api] | set(REFUSED[api])):
        probe = probes[name]
        extra = probe if name in ("top_logprobs",) else {name: probe}
        r = httpx.post(url + path, json={**base, **extra}, timeout=120)
        if name in REFUSED[api]:
            assert r.status_code == 400, (name, r.text)
            body = r.json()
            if api.startswith("openai"):
                assert body["error"]["param"] == name, body
            assert f"`{name}`" in r.text, body
            refused.append(name)
        else:
            assert r.status_code == 200, (name, r.text)
            answered.append(name)
    assert answered and refused
    # the no-op values of a refused field are accepted (clients send defaults)
    for name, (off, _) in REFUSED[api].items():
        for value in off:
            if value is not None:
                r = httpx.post(url + path, json={**base, name: value}, timeout=120)
                assert r.status_code == 200, (name, value, r.text)
