"""Hostile requests get a 4xx in the API's own shape, never a 5xx: deep JSON, lone surrogates,
huge integers, NaN, a client dropping mid-upload; /metrics counts every response; requests in
flight at shutdown end with a proper last event or a 503 body."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import KEY, TIERS, LiveServer, demo_model
from structlog.testing import capture_logs

from edge0.server.app import ServerConfig
from edge0.server.jsonbody import MAX_DEPTH

AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "def f(x):"}], "max_tokens": 2}
COMPLETION = {"model": "m", "prompt": "def f(x):", "max_tokens": 2}
APIS = [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT), ("/v1/messages", CHAT)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model(tmp_path_factory)


def config(model: Path, **kw: Any) -> ServerConfig:
    return ServerConfig(
        model=model,
        engine={"tiers": TIERS, "mode": "route", **kw},
        model_id="edge0-demo",
        api_key=KEY,
        max_body=1 << 20,
    )


@pytest.fixture(scope="module")
def url(model: Path) -> Iterator[str]:
    with LiveServer(config(model)) as base:
        yield base


def post(url: str, path: str, raw: bytes, **kw: Any) -> httpx.Response:
    return httpx.post(url + path, content=raw, headers=AUTH, timeout=60, **kw)


def with_field(body: dict[str, Any], name: str, raw: str) -> bytes:
    """`body` as JSON text with field `name` replaced by the raw JSON text `raw`."""
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in body.items() if k != name]
    return ("{" + ", ".join([*fields, f"{json.dumps(name)}: {raw}"]) + "}").encode()


def error_of(path: str, r: httpx.Response, status: int = 400) -> str:
    """The error message, after checking the status and the API's error shape."""
    assert r.status_code == status, r.text
    body = r.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
    return str(body["error"]["message"])


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


@pytest.mark.parametrize(("path", "body"), APIS)
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5_000, 200_000])
def test_deeply_nested_json_is_400(url: str, path: str, body: dict[str, Any], depth: int) -> None:
    field = "prompt" if "prompt" in body else "messages"
    raw = with_field(body, field, "[" * depth + "]" * depth)
    assert f"more than {MAX_DEPTH} levels deep" in error_of(path, post(url, path, raw))


def test_nesting_up_to_the_limit_is_parsed(url: str) -> None:
    deep = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)  # the body object is level 1
    raw = with_field(COMPLETION, "metadata", deep)  # an ignored field: the request runs
    assert post(url, "/v1/completions", raw).status_code == 200


@pytest.mark.parametrize(
    ("path", "field", "raw", "param"),
    [
        ("/v1/completions", "prompt", '"a\\ud800b"', "prompt"),
        ("/v1/completions", "stop", '["\\udfff"]', "stop[0]"),
        (
            "/v1/chat/completions",
            "messages",
            '[{"role": "user", "content": "hi \\udc00"}]',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            "messages",
            '[{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]',
            "messages[0].content[0].text",
        ),
        (
            "/v1/messages",
            "messages",
            '[{"role": "user", "content": "\\ud800"}]',
            "messages[0].content",
        ),
        ("/v1/messages", "system", '"\\udbff x"', "system"),
    ],
)
def test_lone_surrogate_in_a_prompt_or_message_is_400(
    url: str, path: str, field: str, raw: str, param: str
) -> None:
    body = COMPLETION if path == "/v1/completions" else CHAT
    r = post(url, path, with_field(body, field, raw))
    assert "lone UTF-16 surrogate" in error_of(path, r) and param in r.text
    paired = raw.replace("\\ud800", "\\ud83d\\ude00").replace("\\udc00", "\\ud83d\\ude00")
    if paired != raw:  # the same text with a proper pair is served
        assert post(url, path, with_field(body, field, paired)).status_code == 200


def test_raw_utf8_encoded_surrogate_bytes_are_400(url: str) -> None:
    raw = b'{"prompt": "a\xed\xa0\x80", "max_tokens": 2}'  # json.loads lets these through
    assert "surrogate" in error_of("/v1/completions", post(url, "/v1/completions", raw))


@pytest.mark.parametrize(("path", "body"), APIS)
def test_integer_literal_over_python_digit_limit_is_400(
    url: str, path: str, body: dict[str, Any]
) -> None:
    r = post(url, path, with_field(body, "max_tokens", "9" * 5000))
    assert "longer than 4300 digits" in error_of(path, r)
    r = post(url, path, with_field(body, "seed", "9" * 40))  # parsed, then refused by size
    assert "below 2**64" in error_of(path, r)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_number_literals_are_400(url: str, literal: str) -> None:
    r = post(url, "/v1/completions", with_field(COMPLETION, "temperature", literal))
    assert f"{literal} is not a JSON number" in error_of("/v1/completions", r)


def test_odd_content_length_headers_get_no_5xx(url: str) -> None:
    for value in ("9" * 30, "1e9", "-1", "²"):
        raw = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        raw += f"Content-Length: {value}\r\nConnection: close\r\n\r\n{{}}"
        assert _raw_status(url, raw.encode("latin-1")) < 500, value


@pytest.mark.parametrize("digits", [19, 20, 30])
def test_a_content_length_of_19_digits_or_more_gets_413_at_once(url: str, digits: int) -> None:
    raw = f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    raw += f"Content-Length: {'9' * digits}\r\n\r\n"  # and no body: none is waited for
    assert _raw_status(url, raw.encode()) == 413


def _raw_status(url: str, request: bytes) -> int:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        reply = sock.recv(4096)
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else 400


def test_a_client_dropping_mid_upload_is_no_internal_error(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    before = metric(url, "edge0_http_responses_total", route="/v1/completions", status="499")
    with capture_logs() as events:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
                + f"Authorization: Bearer {KEY}\r\n\r\n".encode()
                + b'{"prompt": "'
                + b"x" * 999
            )
        _wait(
            lambda: (
                metric(url, "edge0_http_responses_total", route="/v1/completions", status="499")
                > before
            )
        )
    assert not [e for e in events if e.get("log_level") in ("error", "critical")], events
    assert metric(url, "edge0_error_responses_total", status="500") == 0


def _wait(cond: Any, timeout: float = 30.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        done.wait(0.05)
    raise AssertionError("timed out")


def test_metrics_count_every_response_by_route_method_and_status(url: str) -> None:
    def count(route: str, method: str, status: str) -> float:
        return metric(url, "edge0_http_responses_total", route=route, method=method, status=status)

    cases = [  # (method, path, headers, route label, status)
        ("GET", "/health", AUTH, "/health", "200"),
        ("GET", "/health", {}, "/health", "401"),
        ("GET", "/v2/nowhere", AUTH, "unmatched", "404"),
        ("GET", "/v1/completions", AUTH, "/v1/completions", "405"),
        ("BREW", "/v1/messages", AUTH, "/v1/messages", "405"),
        ("GET", "/v1/models/other", AUTH, "/v1/models/{model:path}", "404"),
        ("POST", "/v1/completions", AUTH, "/v1/completions", "400"),
    ]
    methods = {"BREW": "other"}
    before = [count(r, methods.get(m, m), s) for m, _, _, r, s in cases]
    errors_before = metric(url, "edge0_error_responses_total")
    for method, path, headers, _, status in cases:
        r = httpx.request(method, url + path, headers=headers, content=b"{}", timeout=60)
        assert str(r.status_code) == status, (method, path, r.text)
    after = [count(r, methods.get(m, m), s) for m, _, _, r, s in cases]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1.0] * len(cases)
    assert metric(url, "edge0_error_responses_total") - errors_before == len(cases) - 1


def _stream_events(url: str, path: str, body: dict[str, Any], out: list[str]) -> None:
    with httpx.stream("POST", url + path, json=body, headers=AUTH, timeout=120) as r:
        out.append(f"status {r.status_code}")
        out.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))


def _whole(url: str, path: str, body: dict[str, Any], out: list[Any]) -> None:
    out.append(httpx.post(url + path, json=body, headers=AUTH, timeout=120))


def test_requests_past_the_shutdown_grace_end_in_the_api_shape(model: Path) -> None:
    long_stream: list[str] = []
    long_whole: list[Any] = []
    server = LiveServer(config(model, max_batch=2), grace=0.5)
    with server as base:
        body = {"prompt": "def f(x):", "max_tokens": 400, "temperature": 0}
        threads = [
            threading.Thread(
                target=_stream_events,
                args=(base, "/v1/completions", {**body, "stream": True}, long_stream),
            ),
            threading.Thread(
                target=_whole, args=(base, "/v1/messages", {**CHAT, "max_tokens": 400}, long_whole)
            ),
        ]
        for t in threads:
            t.start()
        _wait(lambda: len(long_stream) > 3)  # the stream is under way
        server.server.should_exit = True  # what Ctrl-C and SIGTERM do
        for t in threads:
            t.join(timeout=60)
    assert long_stream[0] == "status 200" and "[DONE]" not in long_stream
    last = json.loads(long_stream[-1])["error"]
    assert last["code"] == "shutting_down" and "--shutdown-grace" in last["message"]
    assert error_of("/v1/messages", long_whole[0], 503)
    assert long_whole[0].json()["error"]["type"] == "overloaded_error"


def test_requests_within_the_shutdown_grace_finish(model: Path) -> None:
    out: list[str] = []
    server = LiveServer(config(model), grace=60)
    with server as base:
        body = {"prompt": "def f(x):", "max_tokens": 12, "temperature": 0, "stream": True}
        t = threading.Thread(target=_stream_events, args=(base, "/v1/completions", body, out))
        t.start()
        _wait(lambda: len(out) > 1)
        server.server.should_exit = True
        t.join(timeout=60)
    assert out[0] == "status 200" and out[-1] == "[DONE]", out
    assert json.loads(out[-2])["choices"][0]["finish_reason"] in ("length", "stop")
