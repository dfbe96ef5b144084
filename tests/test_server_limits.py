"""The server's limits (docs/server.md, Limits) on a live server: a head that never ends and a body
that trickles get 408, one connection past the cap gets 503, a Content-Length over the limit (of
any length) gets 413 at once, broken HTTP gets a 400 in the API's shape; a full queue answers 429
(Anthropic 529) with Retry-After; /metrics counts each refusal."""

from __future__ import annotations

import gc
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import KEY, TIERS, LiveServer, demo_model

from edge0.server.app import ServerConfig
from edge0.server.limits import Limits

AUTH = {"Authorization": f"Bearer {KEY}"}
LIMITS = Limits(max_connections=6, header_timeout=0.6, body_timeout=0.6, keep_alive=30, max_queue=1)
HEAD = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model(tmp_path_factory)


@pytest.fixture(scope="module")
def url(model: Path) -> Iterator[str]:
    config = ServerConfig(
        model=model,
        engine={"tiers": TIERS, "mode": "route", "max_batch": 1},
        model_id="edge0-demo",
        api_key=KEY,
        max_body=1 << 16,
        limits=LIMITS,
    )
    with LiveServer(config) as base:
        yield base


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def answer(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    """Status, headers and JSON body of the one answer on `sock`, read to the server's EOF."""
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(ln.lower().split(": ", 1) for ln in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def refused(url: str, reason: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "edge0_refused_total" and s.labels.get("reason") == reason:
                return s.value
    return 0.0


@pytest.mark.parametrize("sent", ["", HEAD, "POST /v1/mess"])
def test_a_request_head_that_never_ends_gets_408_and_is_closed(url: str, sent: str) -> None:
    before = refused(url, "header_timeout")
    with connect(url) as sock:
        sock.sendall(sent.encode())
        start = time.monotonic()
        status, headers, body = answer(sock)
    assert status == 408 and headers["connection"] == "close"
    assert "--header-timeout" in json.dumps(body)
    assert time.monotonic() - start < LIMITS.header_timeout + 5
    assert refused(url, "header_timeout") == before + 1


def test_a_head_sent_a_byte_at_a_time_still_gets_408(url: str) -> None:
    with connect(url) as sock:
        start = time.monotonic()
        for byte in HEAD.encode() * 10:  # each byte well inside the deadline, the whole not
            if select.select([sock], [], [], 0.05)[0]:  # the server has answered
                break
            sock.sendall(bytes([byte]))
        status, _, _ = answer(sock)
    assert status == 408 and time.monotonic() - start < LIMITS.header_timeout * 3


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messages"])
def test_a_body_that_trickles_gets_408_in_the_apis_shape(url: str, path: str) -> None:
    before = refused(url, "body_timeout")
    with connect(url) as sock:
        sock.sendall(
            HEAD.replace("/v1/completions", path).encode()
            + b"Content-Length: 100\r\n\r\n"
            + b'{"prompt": '
        )
        status, headers, body = answer(sock)
    assert status == 408 and headers["connection"] == "close"
    message = body["error"]["message"]
    assert "--body-timeout" in message and ("type" in body) == (path == "/v1/messages")
    assert refused(url, "body_timeout") == before + 1


@pytest.mark.parametrize("length", ["70000", "9" * 19, "9" * 20, "9" * 30])
def test_a_content_length_over_the_limit_gets_413_at_once(url: str, length: str) -> None:
    with connect(url) as sock:
        sock.sendall(f"{HEAD}Content-Length: {length}\r\n\r\n".encode())
        start = time.monotonic()
        status, headers, body = answer(sock)
    assert status == 413 and headers["connection"] == "close", body
    assert "--max-body" in body["error"]["message"]
    assert time.monotonic() - start < LIMITS.body_timeout  # not a wait for the body


def test_a_large_body_sent_anyway_is_drained_not_reset(url: str) -> None:
    body = b"x" * (8 << 20)  # the server answers 413 after 64 KiB, then drains while it closes
    with connect(url) as sock:
        sock.sendall(f"{HEAD}Content-Length: {len(body)}\r\n\r\n".encode())
        sock.sendall(body)  # no reset (ECONNRESET, EPIPE) while the client still writes
        status, _, answered = answer(sock)
    assert status == 413 and "--max-body" in answered["error"]["message"]


def test_broken_http_gets_a_400_in_the_apis_shape(url: str) -> None:
    before = refused(url, "bad_http")
    for path in ("/v1/completions", "/v1/messages"):
        with connect(url) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n".encode())
            status, headers, body = answer(sock)
        assert status == 400 and headers["content-type"] == "application/json"
        assert "malformed HTTP request" in body["error"]["message"]
        assert (body.get("type") == "error") == (path == "/v1/messages")
    assert refused(url, "bad_http") == before + 2


def test_one_connection_past_the_cap_gets_503_then_room_comes_back(url: str) -> None:
    idle = [connect(url) for _ in range(LIMITS.max_connections)]
    try:
        with connect(url) as extra:
            status, headers, body = answer(extra)
        assert status == 503 and headers["retry-after"] == "1"
        assert "--max-connections" in body["error"]["message"]
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/health", headers=AUTH)
        except httpx.HTTPError:
            continue
        if r.status_code == 200:
            break
    assert r.status_code == 200
    assert refused(url, "connections") >= 1


STOP = threading.Event()  # a streaming reader leaves (disconnects) once it is set


def _stream(url: str, path: str, body: dict[str, Any], out: list[Any]) -> None:
    with httpx.stream("POST", url + path, json=body, headers=AUTH, timeout=120) as r:
        out.append(r.status_code)
        for line in r.iter_lines():
            if line:
                out.append(line)
            if STOP.is_set() and body["max_tokens"] > 100:
                return


def test_a_full_queue_answers_429_or_529_with_retry_after(url: str) -> None:
    long = {"prompt": "def f(x):", "max_tokens": 400, "stream": True, "temperature": 0}
    running: list[Any] = []
    waiting: list[Any] = []
    threads = [
        threading.Thread(target=_stream, args=(url, "/v1/completions", long, running)),
        threading.Thread(
            target=_stream, args=(url, "/v1/completions", {**long, "max_tokens": 2}, waiting)
        ),
    ]
    before = refused(url, "queue_full")
    threads[0].start()
    _wait(lambda: len(running) > 2)  # decoding: the one place of --max-batch 1 is taken
    threads[1].start()
    _wait(lambda: _gauge(url, "edge0_queue_depth") == 1)  # queued: the queue of 1 is full
    chat = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=chat, headers=AUTH, timeout=30)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert "--max-queue" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/messages", json=chat, headers=AUTH, timeout=30)
    assert r.status_code == 529 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "overloaded_error"
    assert refused(url, "queue_full") == before + 2
    STOP.set()  # the first client leaves: the queued one gets its place
    for t in threads:
        t.join(timeout=120)
    assert running[0] == 200 and waiting[0] == 200 and waiting[-1] == "data: [DONE]"
    assert _gauge(url, "edge0_queue_depth") == 0


def _gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    return next(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


def _wait(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_body_left_unread_may_follow_then_the_connection_closes(url: str) -> None:
    head = f"POST /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    with connect(url) as sock:  # sent whole: the connection stays usable (keep-alive)
        sock.sendall(f"{head}Content-Length: 2\r\n\r\n{{}}".encode() * 2)
        time.sleep(LIMITS.body_timeout * 2)
        sock.sendall(
            f"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
        )
        sock.settimeout(5)
        replies = b""
        while replies.count(b"HTTP/1.1 ") < 3:
            replies += sock.recv(65536)
        assert replies.count(b"HTTP/1.1 405 ") == 2 and b"HTTP/1.1 200 " in replies
    with connect(url) as sock:  # the unread body never ends: closed after the body timeout
        sock.sendall(f"{head}Content-Length: 100\r\n\r\n{{".encode())
        start = time.monotonic()
        while sock.recv(65536):
            pass
        assert time.monotonic() - start < LIMITS.body_timeout + 2  # not the keep-alive (30 s)


def test_nothing_keeps_a_closed_connection_alive(model: Path) -> None:
    """A connection answered before its body was read holds no timer once it is closed (each
    would keep its protocol and buffers for the body timeout: 30 s of a 413 flood's memory)."""
    from edge0.server.connections import GuardedH11

    limits = Limits(body_timeout=30, header_timeout=30)
    config = ServerConfig(model=model, engine={"tiers": TIERS}, api_key=KEY, limits=limits)
    with LiveServer(config) as base:
        for _ in range(30):
            with connect(base) as sock:
                sock.sendall(f"{HEAD}Content-Length: {1 << 30}\r\n\r\n".encode() + b"x" * 4096)
                assert answer(sock)[0] == 413
        time.sleep(1.0)  # the server's side of the last close
        gc.collect()
        alive = [p for p in gc.get_objects() if isinstance(p, GuardedH11)]
        assert len(alive) <= 2, f"{len(alive)} connections still held"


def test_an_idle_server_gives_its_freed_memory_back(url: str) -> None:
    before = _gauge(url, "edge0_heap_trims_total")
    chat = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, headers=AUTH).status_code == 200
    deadline = time.monotonic() + 30
    while _gauge(url, "edge0_heap_trims_total") == before:  # each scrape restarts the idle clock
        assert time.monotonic() < deadline, "no trim after the server fell idle"
        time.sleep(1.5)
