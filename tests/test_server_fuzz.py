"""Fuzz of the running server (real uvicorn on a free loopback port, a tiny model): random JSON
values (deep, huge, odd Unicode, lone surrogates, wrong types) in every field of every route,
random bodies, paths, methods and keys. Every answer is below 500 (a stream's events too); the
server still answers /health and the same text for a normal request afterwards."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from runtime_helpers import build_store
from server_helpers import KEY, LiveServer

from edge0.server.app import ServerConfig

AUTH = {"Authorization": f"Bearer {KEY}"}
EXAMPLES = int(os.environ.get("EDGE0_FUZZ_EXAMPLES", "700"))  # per test; 3 tests
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
NORMAL = {"prompt": "def f(x):", "max_tokens": 6, "temperature": 0}
SENTINEL = "\x00edge0-fuzz-slot\x00"
OPENAI_FIELDS = (
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "best_of",
    "user",
    "logit_bias",
    "tools",
    "tool_choice",
    "response_format",
    "parallel_tool_calls",
)
MESSAGE_PATHS: tuple[tuple[str | int, ...], ...] = (
    ("messages",),
    ("messages", 0),
    ("messages", 0, "role"),
    ("messages", 0, "content"),
    ("messages", 1, "content"),
    ("messages", 1, "content", 0),
    ("messages", 1, "content", 0, "type"),
    ("messages", 1, "content", 0, "text"),
    ("messages", 1, "name"),
)
BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {
        "model": "m",
        "prompt": "def f(x):",
        "max_tokens": 1,
        "stream_options": {"include_usage": False},
    },
    "/v1/chat/completions": {
        "model": "m",
        "max_tokens": 1,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
    },
    "/v1/messages": {
        "model": "m",
        "max_tokens": 1,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        ],
    },
}
FIELDS: dict[str, tuple[tuple[str | int, ...], ...]] = {
    "/v1/completions": (
        *((f,) for f in OPENAI_FIELDS),
        ("prompt",),
        ("echo",),
        ("suffix",),
        ("stream_options", "include_usage"),
    ),
    "/v1/chat/completions": (
        *((f,) for f in OPENAI_FIELDS),
        ("max_completion_tokens",),
        *MESSAGE_PATHS,
    ),
    "/v1/messages": (
        ("model",),
        ("max_tokens",),
        ("system",),
        ("temperature",),
        ("top_p",),
        ("top_k",),
        ("stop_sequences",),
        ("stream",),
        ("metadata",),
        ("tools",),
        ("tool_choice",),
        ("thinking",),
        *MESSAGE_PATHS,
    ),
}

# --- raw JSON text for one value ---------------------------------------------------------------
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=40)
    | st.floats(allow_nan=False, allow_infinity=False)
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
raw_value = st.one_of(
    st.builds(json.dumps, values, ensure_ascii=st.booleans()),
    st.integers(1, 3_000).map(lambda n: "[" * n + "]" * n),  # deep
    st.integers(1, 3_000).map(lambda n: '{"a": ' * n + "1" + "}" * n),
    st.integers(1, 6_000).map(lambda n: "9" * n),  # huge integer literals
    st.sampled_from(
        [
            "NaN",
            "Infinity",
            "-Infinity",
            "1e400",
            "-1e400",
            "-0",
            "1e-400",
            "18446744073709551616",
            "-9223372036854775809",
            "0.5",
            "1" + "0" * 400,
        ]
    ),
    st.lists(
        st.sampled_from(
            [
                "a",
                "\\ud800",
                "\\udfff",
                "\\ud83d\\ude00",
                "\\u0000",
                "\u202e",
                "\U0001f600",
                "\\n",
                "\\\\",
                "\u0301",
            ]
        ),
        max_size=8,
    ).map(lambda parts: '"' + "".join(parts) + '"'),  # lone surrogates and odd code points
    st.integers(1, 200_000).map(lambda n: json.dumps("x" * n)),  # long (413 past max_body)
    st.lists(st.integers(-5, 600), min_size=1, max_size=30).map(json.dumps),  # token ids
)


def put(body: dict[str, Any], path: tuple[str | int, ...], raw: str) -> bytes:
    """`body` as JSON text with the value at `path` replaced by the raw text `raw`."""
    copy = json.loads(json.dumps(body))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = SENTINEL
    return json.dumps(copy).replace(json.dumps(SENTINEL), raw).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    # 32 positions: every request that generates ends within ~30 steps of a tiny model
    store = build_store(tmp_path_factory.mktemp("fuzz"), "qwen3_moe", max_positions=32)
    config = ServerConfig(
        model=Path(store),
        engine={"tiers": "pread", "mode": "route"},
        model_id="m",
        api_key=KEY,
        max_body=64 << 10,
    )
    with LiveServer(config) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client, normal_text(client)


def normal_text(client: httpx.Client) -> str:
    r = client.post("/v1/completions", json=NORMAL, headers=AUTH)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def check(r: httpx.Response) -> None:
    """Below 500; a 200 stream holds no server-side error event either."""
    event(f"status {r.status_code}")
    assert r.status_code < 500, (r.request.url, r.request.content[:300], r.text[:500])
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        assert '"server_error"' not in r.text and '"api_error"' not in r.text, r.text[-500:]


@FUZZ
@given(data=st.data(), route=st.sampled_from(sorted(BODIES)), raw=raw_value)
def test_any_value_in_any_field_is_answered_below_500(
    server: tuple[httpx.Client, str], data: st.DataObject, route: str, raw: str
) -> None:
    client, _ = server
    path = data.draw(st.sampled_from(FIELDS[route]), label="field")
    check(client.post(route, content=put(BODIES[route], path, raw), headers=AUTH))


@FUZZ
@given(
    route=st.sampled_from(sorted(BODIES)),
    key=st.text(max_size=20),
    raw=raw_value,
    whole=st.one_of(st.none(), raw_value, st.binary(max_size=200)),
)
def test_any_extra_key_or_whole_body_is_answered_below_500(
    server: tuple[httpx.Client, str], route: str, key: str, raw: str, whole: str | bytes | None
) -> None:
    client, _ = server
    if whole is None:
        body = put({**BODIES[route], key: None}, (key,), raw)
    else:
        body = whole.encode() if isinstance(whole, str) else whole
    check(client.post(route, content=body, headers=AUTH))


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "BREW"]),
    path=st.one_of(
        st.sampled_from(
            [
                "/health",
                "/metrics",
                "/v1/models",
                "/v1/completions",
                "/v1/chat/completions",
                "/v1/messages",
                "/v1/models/m",
            ]
        ),
        st.text(max_size=30).map(lambda t: "/v1/models/" + quote(t, safe="")),
        st.text(max_size=30).map(lambda t: "/" + quote(t, safe="/")),
        st.just("/v1/models/%ED%A0%80%FF"),
    ),
    key=st.one_of(
        st.just(KEY),
        st.text(st.characters(max_codepoint=255, exclude_characters="\r\n\x00"), max_size=40),
    ),
    header=st.sampled_from(["authorization", "x-api-key", "content-type", "accept"]),
)
def test_any_path_method_and_header_is_answered_below_500(
    server: tuple[httpx.Client, str], method: str, path: str, key: str, header: str
) -> None:
    client, _ = server
    value = (key if header != "authorization" else f"Bearer {key}").encode("latin-1")
    headers = {**AUTH, header: value} if header != "authorization" else {header: value}
    body = json.dumps(BODIES["/v1/messages"]).encode() if method == "POST" else None
    try:
        r = client.request(method, path, content=body, headers=headers)
    except httpx.LocalProtocolError:  # a header value httpx itself refuses to send
        return
    check(r)


# JSON schemas that refer to themselves ($ref "#", $defs loops), nest, or leave a way out
schema_leaf = st.sampled_from(
    [{"type": "string", "maxLength": 3}, {"type": "integer"}, {"$ref": "#"}, {"const": 1}, {}]
)
schemas = st.recursive(
    schema_leaf,
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "properties": st.dictionaries(st.sampled_from("ab"), inner, max_size=2),
                "required": st.lists(st.sampled_from("ab"), max_size=2, unique=True),
            }
        ),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)}),
        st.fixed_dictionaries(
            {"$defs": st.fixed_dictionaries({"a": inner, "b": inner}), "$ref": st.just("#/$defs/a")}
        ),
        st.just(
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
        ),
    ),
    max_leaves=6,
)


@settings(
    max_examples=max(20, EXAMPLES // 5),
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(schema=schemas)
# a required self-reference: no finite value, and the grammar fails only while decoding
@example(schema={"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]})
def test_any_response_format_schema_is_enforced_or_refused_never_empty(
    server: tuple[httpx.Client, str], schema: dict[str, Any]
) -> None:
    client, _ = server
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    chat = [{"role": "user", "content": "hi"}]  # short: the tiny model's context is 32
    body = {"model": "m", "messages": chat, "max_tokens": 6, "response_format": fmt}
    r = client.post("/v1/chat/completions", json=body, headers=AUTH)
    check(r)
    if r.status_code == 200:
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] != "", (schema, choice)  # a 200 with "" is no JSON
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


def test_the_server_still_serves_after_the_fuzz(server: tuple[httpx.Client, str]) -> None:
    client, before = server
    assert client.get("/health", headers=AUTH).json()["status"] == "ok"
    assert normal_text(client) == before  # greedy: the same text as before the fuzz
    metrics = client.get("/metrics", headers=AUTH).text
    assert 'edge0_error_responses_total{status="500"}' not in metrics
