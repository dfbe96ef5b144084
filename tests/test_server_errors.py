"""`edge0 serve` errors: API key on every route, malformed and oversized bodies, too-long
prompts, tier errors (before and during a stream) in each API's shape; the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_helpers import KEY, FlakyTier, LiveServer, demo_model

from edge0.server.app import ServerConfig

AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 4096
ROUTES = [
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/messages"),
]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "def parse(s):"}], "max_tokens": 4}
USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
RESULT = {"type": "tool_result", "content": "42"}  # no tool_use_id
TURN = [CHAT["messages"][0], {"role": "assistant", "content": [USE]}]  # (a user turn, a call)
COMPLETION = {"model": "m", "prompt": "def parse(s):", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model(tmp_path_factory)


@pytest.fixture(scope="module")
def tier(model: Path) -> FlakyTier:
    return FlakyTier(model)


@pytest.fixture(scope="module")
def url(model: Path, tier: FlakyTier) -> Iterator[str]:
    config = ServerConfig(
        model=model,
        engine={"tiers": tier, "mode": "route"},
        model_id="edge0-demo",
        api_key=KEY,
        max_body=LIMIT,
    )
    with LiveServer(config) as base:
        yield base


def post(url: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        url + path, content=data, headers={**AUTH, **kw.pop("headers", {})}, timeout=60, **kw
    )


def openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return dict(err)


def anthropic_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return dict(body["error"])


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_api_key_is_checked_on_every_route(url: str, method: str, path: str) -> None:
    body = CHAT if path != "/v1/completions" else COMPLETION
    for headers in ({}, {"Authorization": "Bearer nope"}, {"x-api-key": "nope"}):
        r = httpx.request(method, url + path, json=body, headers=headers)
        if path == "/v1/messages":
            assert anthropic_error(r, 401)["type"] == "authentication_error"
        else:
            assert "API key" in openai_error(r, 401)["message"]
    ok = httpx.request(method, url + path, json=body, headers={"x-api-key": KEY}, timeout=60)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/completions", b'{"prompt": ', None, "not valid JSON"),
        ("/v1/completions", b"", None, "empty"),
        ("/v1/completions", b"[1, 2]", None, "JSON object"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "8"}, "max_tokens", "integer"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", "between"),
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature", "number"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream", "true or false"),
        ("/v1/completions", {"prompt": "x", "n": 99}, "n", "between 1 and 8"),
        ("/v1/completions", {"prompt": "x", "logprobs": 9}, "logprobs", "between 0 and 5"),
        ("/v1/completions", {"prompt": "x", "echo": True}, "echo", "not supported"),
        ("/v1/completions", {"prompt": {"text": "x"}}, "prompt", "string"),
        ("/v1/completions", {"prompt": [1, 99999]}, "prompt", "vocabulary"),
        ("/v1/completions", {"prompt": ""}, "prompt", "empty"),
        ("/v1/completions", {}, "prompt", "required"),
        ("/v1/chat/completions", {"messages": "hi"}, "messages", "list"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            "messages[0].role",
            "one of",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
            "string",
        ),
        ("/v1/chat/completions", {"messages": CHAT["messages"], "stop": [1]}, "stop", "strings"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": None}]},
            "messages[0].content",
            "not null",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "system", "content": None}, *CHAT["messages"]]},
            "messages[0].content",
            "not null",
        ),
        ("/v1/completions", b"null", None, "JSON object, not null"),
        ("/v1/completions", json.dumps(COMPLETION).encode("utf-16"), None, "not UTF-8"),
        ("/v1/completions", json.dumps(COMPLETION).encode("utf-16-le"), None, "not UTF-8"),
        ("/v1/completions", json.dumps(COMPLETION).encode("utf-32"), None, "not UTF-8"),
        ("/v1/completions", b'{"prompt": "\xff"}', None, "byte 0xff at offset 12"),
        ("/v1/completions", {"prompt": "x", "max_tokens": None, "n": True}, "n", "not true"),
        ("/v1/completions", {"prompt": None}, "prompt", "required"),
        ("/v1/completions", {"prompt": "x", "stop": [None]}, "stop", "not array [null]"),
    ],
)
def test_bad_openai_requests_get_400(
    url: str, path: str, body: Any, param: str | None, words: str
) -> None:
    err = openai_error(post(url, path, body), 400)
    assert words in err["message"] and err["param"] == param
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{nope", "not valid JSON"),
        ({"model": "m", "messages": CHAT["messages"]}, "`max_tokens` is required"),
        ({"messages": CHAT["messages"], "max_tokens": 4}, "`model` is required"),
        ({**CHAT, "messages": [{"role": "system", "content": "x"}]}, "user, assistant"),
        ({**CHAT, "stop_sequences": "END"}, "list of non-empty strings"),
        ({**CHAT, "temperature": 1.5}, "between 0.0 and 1.0"),
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, '"image" block'),
        ({**CHAT, "tools": [{"name": "f"}]}, "`tools[0].input_schema` is required"),
        (
            {**CHAT, "tools": [{"name": "f", "input_schema": None}]},
            "`tools[0].input_schema` is required",
        ),
        ({**CHAT, "messages": [*TURN, {"role": "user", "content": [RESULT]}]}, "tool_use_id"),
        (
            {
                **CHAT,
                "messages": [*TURN, {"role": "user", "content": [{**RESULT, "tool_use_id": 7}]}],
            },
            "tool_use_id` must be the id of the tool_use it answers, not integer 7",
        ),
        (
            {**CHAT, "messages": [TURN[0], {**TURN[1], "content": [{**USE, "input": "{}"}]}]},
            '`messages[1].content[0].input` must be an object, not string "{}"',
        ),
        (
            {**CHAT, "messages": [TURN[0], {**TURN[1], "content": [{**USE, "name": None}]}]},
            "`messages[1].content[0].name` must be a tool name, not null",
        ),
        ({**CHAT, "messages": TURN[1:] + TURN[:1]}, "`messages[0].role` must be user"),
        (json.dumps(CHAT).encode("utf-16"), "not UTF-8"),
    ],
)
def test_bad_anthropic_requests_get_400(url: str, body: Any, words: str) -> None:
    err = anthropic_error(post(url, "/v1/messages", body), 400)
    assert err["type"] == "invalid_request_error" and words in err["message"]


def test_oversized_bodies_get_413(url: str) -> None:
    big = {**COMPLETION, "prompt": "x" * LIMIT}
    assert "--max-body" in openai_error(post(url, "/v1/completions", big), 413)["message"]
    assert (
        anthropic_error(post(url, "/v1/messages", {**CHAT, "system": "x" * LIMIT}), 413)["type"]
        == "request_too_large"
    )

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        yield b'{"prompt": "'
        for _ in range(LIMIT // 512 + 1):
            yield b"y" * 512
        yield b'"}'

    r = httpx.post(url + "/v1/completions", content=chunks(), headers=AUTH)
    assert openai_error(r, 413)["message"].startswith("the request body is")


def test_too_long_prompts_and_unknown_routes(url: str) -> None:
    with (
        openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as info,
    ):
        client.completions.create(model="m", prompt=list(range(1, 600)), max_tokens=4)
    assert info.value.code == "context_length_exceeded"
    assert "599 tokens" in info.value.message and "context is 512" in info.value.message
    with (
        anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as claude,
        pytest.raises(anthropic.BadRequestError) as err,
    ):
        claude.messages.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "def f(): " * 300}]
        )
    assert "shorten the prompt" in str(err.value)
    assert "no route /v2/x" in openai_error(httpx.get(url + "/v2/x", headers=AUTH), 404)["message"]
    assert openai_error(httpx.get(url + "/v1/completions", headers=AUTH), 405)
    assert anthropic_error(httpx.get(url + "/v1/messages", headers=AUTH), 405)


def test_tier_errors_answer_500_and_the_server_keeps_serving(url: str, tier: FlakyTier) -> None:
    good = post(url, "/v1/completions", COMPLETION).json()["choices"][0]["text"]
    tier.failing = True
    try:
        err = openai_error(post(url, "/v1/completions", COMPLETION), 500)
        assert err["type"] == "server_error" and err["code"] == "tier_error"
        assert "injected fault" in err["message"] and "layer" in err["message"]
        err = openai_error(post(url, "/v1/chat/completions", {**CHAT, "stream": True}), 500)
        assert "edge0 verify" in err["message"]  # fails in prefill: a status, not a stream
        err = anthropic_error(post(url, "/v1/messages", {**CHAT, "stream": True}), 500)
        assert err["type"] == "api_error" and "injected fault" in err["message"]
    finally:
        tier.failing = False
    assert post(url, "/v1/completions", COMPLETION).json()["choices"][0]["text"] == good
    metrics = httpx.get(url + "/metrics", headers=AUTH).text
    assert "edge0_tier_errors_total 3.0" in metrics
    assert 'edge0_requests_total{api="openai.completions",outcome="error"} 1.0' in metrics


def test_a_tier_error_mid_stream_ends_it_with_an_error_event(url: str, tier: FlakyTier) -> None:
    events: list[Any] = []
    body = {**COMPLETION, "max_tokens": 200, "stream": True}
    try:
        with httpx.stream(
            "POST", url + "/v1/completions", json=body, headers=AUTH, timeout=60
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    tier.failing = True  # after the first piece: later steps' reads fail
    finally:
        tier.failing = False
    assert len(events) >= 2 and "[DONE]" not in events
    last = json.loads(events[-1])
    assert last["error"]["code"] == "tier_error" and "injected fault" in last["error"]["message"]
    assert post(url, "/v1/completions", COMPLETION).status_code == 200


LOOP = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$ref": "#"}, "admits no JSON value"),
        (LOOP, "admits no JSON value"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}, "regex"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength (5)"),
    ],
)
def test_a_schema_that_cannot_be_enforced_is_a_short_400(
    url: str, schema: dict[str, Any], words: str
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for stream in (False, True):
        r = post(url, "/v1/chat/completions", {**CHAT, "response_format": fmt, "stream": stream})
        err = openai_error(r, 400)
        assert err["param"] == "response_format" and words in err["message"], err
        assert "\n" not in err["message"] and len(err["message"]) < 300, err["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {
                **CHAT,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": LOOP}}],
                "tool_choice": "required",
            },
        ),
        (
            "/v1/messages",
            {
                **CHAT,
                "tools": [{"name": "f", "input_schema": LOOP}],
                "tool_choice": {"type": "any"},
            },
        ),
    ],
)
def test_a_forced_tool_whose_schema_admits_nothing_is_a_400(
    url: str, path: str, body: dict[str, Any]
) -> None:
    r = post(url, path, body)
    err = anthropic_error(r, 400) if path == "/v1/messages" else openai_error(r, 400)
    assert "tool 'f''s schema admits no JSON value" in err["message"], err
