"""`GET /v1/edge0/events` and the page's routes without a browser: the step events agree with
the request's stats line, a listener changes no token, a slow one is dropped while decoding
goes on, nothing is collected when no one listens; the page's headers, key and weight."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import KEY, TIERS, LiveServer, demo_model

from edge0.server import page
from edge0.server.app import ServerConfig
from edge0.server.events import EventHub, Listener, _stream

AUTH = {"x-api-key": KEY}
BODY = {"prompt": "def parse(s):", "max_tokens": 10, "temperature": 0}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "server.md"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = ServerConfig(
        model=demo_model(tmp_path_factory),
        engine={"tiers": TIERS, "max_batch": 1},
        model_id="edge0-demo",
        api_key=KEY,
    )
    server = LiveServer(config)
    with server:
        yield server


def hub_of(live: LiveServer) -> EventHub:
    hub: EventHub = live.app.state.events
    return hub


def on_loop(hub: EventHub, fn: Any) -> Any:
    """Run `fn()` on the server's event loop (where the hub lives) and return its result."""

    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), hub._loop).result(timeout=10)


def complete(live: LiveServer) -> dict[str, Any]:
    r = httpx.post(live.url + "/v1/completions", json=BODY, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


class Reader:
    """An event stream read in a thread until its first `done` event: (name, data) in order."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[str, Any]] = []
        self.thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self.thread.start()

    def _run(self, url: str) -> None:
        name = ""
        with httpx.stream("GET", url + "/v1/edge0/events", headers=AUTH, timeout=60) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    self.events.append((name, json.loads(line[6:])))
                    if name == "done":
                        return

    def wait_for(self, name: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n, data in self.events:
                if n == name:
                    return data
            time.sleep(0.02)
        raise AssertionError(f"no {name} event: {self.events[:3]}")


def wait_detached(live: LiveServer) -> None:
    setup = live.backend.engine.setup
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (setup.tracer.sink or setup.ctx.watch):
        time.sleep(0.02)
    assert setup.tracer.sink is None and setup.ctx.watch is None


def test_step_events_agree_with_the_stats_line_and_a_listener_changes_no_token(
    live: LiveServer,
) -> None:
    setup = live.backend.engine.setup
    assert setup.tracer.sink is None and setup.ctx.watch is None  # no listener: nothing watches
    alone = complete(live)
    reader = Reader(live.url)
    info = reader.wait_for("engine")
    assert info["exactness"] == "exact" and info["streamed_layers"]
    assert live.app.state.metrics.http_active == 0  # a watcher keeps no request in flight
    watched = complete(live)
    assert watched["choices"][0]["text"] == alone["choices"][0]["text"]  # the same tokens
    done = reader.wait_for("done")
    reader.thread.join(timeout=10)
    stats = done["stats"]
    assert done["completion_tokens"] == watched["usage"]["completion_tokens"] == 10
    assert stats["exactness"] == "exact" and "exact" in done["line"]
    steps = [d for n, batch in reader.events if n == "steps" for d in batch]
    decode = [s for s in steps if not s["prefill"]]
    assert {s["request"] for s in steps} == {steps[-1]["request"]}  # one request's steps
    assert len(decode) == stats["decode_steps"] == 9
    numbers = [s["step"] for s in decode]  # the prompt's steps, then one per token, in order
    assert numbers == list(range(numbers[0], numbers[0] + 9))
    assert steps[: len(steps) - 9] == [s for s in steps if s["prefill"]] != []
    blocked = sum(s["blocked_ms"] for s in decode) / len(decode)
    compute = sum(s["compute_ms"] for s in decode) / len(decode)
    assert blocked == pytest.approx(stats["blocked_ms_per_step"], abs=0.01)
    assert compute == pytest.approx(stats["compute_ms_per_step"], abs=0.01)
    for s in decode:  # per layer: the step's figures are the sums of its layers' (and its own)
        assert sum(r["blocked_ms"] for r in s["layers"]) == pytest.approx(s["blocked_ms"], abs=0.01)
        assert sum(r["compute_ms"] for r in s["layers"]) <= s["compute_ms"] + 0.01
    asked = sum(r["asked"] for s in steps for r in s["layers"])
    staged = sum(r["staged"] for s in steps for r in s["layers"])
    assert asked and staged / asked == pytest.approx(stats["slot_hit_rate"])
    layers = set(info["streamed_layers"])
    assert all({r["layer"] for r in s["layers"]} == layers for s in decode)
    held = [sum(r["held"] for r in s["layers"]) for s in decode]  # the pool is shared
    assert all(0 < n <= info["slots"] for n in held), (held, info["slots"])
    predicted = sum(r["predicted"] for s in decode for r in s["layers"])
    assert predicted > 0  # exact mode: each step's prediction, scored against what ran
    wait_detached(live)  # the last listener left: the feed is detached again


def test_a_slow_listener_is_dropped_and_decoding_goes_on(live: LiveServer) -> None:
    hub = hub_of(live)
    reference = complete(live)["choices"][0]["text"]

    def subscribe() -> Listener:
        hub.limit = 1  # the `engine` event fills it: the first steps drop it
        return hub.subscribe()  # never read

    listener = on_loop(hub, subscribe)
    try:
        dropped = hub.dropped
        assert live.backend.engine.setup.tracer.sink is not None
        assert complete(live)["choices"][0]["text"] == reference
        assert listener.dropped and not listener.pending
        assert hub.dropped == dropped + 1 and listener not in hub.listeners
        wait_detached(live)
    finally:
        on_loop(hub, lambda: setattr(hub, "limit", 256))


def test_a_listener_backlog_is_bounded() -> None:
    async def run() -> list[str]:
        listener = Listener(2)
        for i in range(3):
            listener.offer("step", str(i))
        assert listener.dropped and not listener.pending
        listener.offer("step", "late")  # nothing more is kept
        return [e for e, _ in listener.pending]

    assert asyncio.run(run()) == []


def test_the_page_is_served_under_the_key_with_a_strict_policy(live: LiveServer) -> None:
    basic = "Basic " + base64.b64encode(f"edge0:{KEY}".encode()).decode()
    r = httpx.get(live.url + "/", headers={"authorization": basic})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    for src in re.findall(r'(?:src|href)="(/[^"]*)"', r.text):  # its assets, from this server
        asset = httpx.get(live.url + src, headers=AUTH)
        assert asset.status_code == 200 and asset.headers["content-security-policy"] == csp
    for bad in ("Basic " + base64.b64encode(b"edge0:nope").decode(), "Basic %%%", "Basic ZWRnZTA="):
        r = httpx.get(live.url + "/", headers={"authorization": bad})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"].startswith("Basic ")
    assert httpx.get(live.url + "/page/page.js").status_code == 401


def test_the_page_weight_is_small_and_stated_in_the_docs() -> None:
    files = page.load()
    weight = page.weight(files)
    assert weight < 24 * 1024, weight
    assert f"{weight:,} bytes" in DOCS.read_text(), f"docs/server.md: state {weight:,} bytes"


def test_a_stream_ends_with_dropped_or_with_end_after_its_events() -> None:
    class Hub:
        limit = 2
        left: list[Listener] = []

        def unsubscribe(self, listener: Listener) -> None:
            self.left.append(listener)

    async def read(listener: Listener) -> list[str]:
        hub: Any = Hub()
        return [e["event"] async for e in _stream(hub, listener)]

    async def run() -> tuple[list[str], list[str]]:
        slow, stopping = Listener(2), Listener(2)
        for listener in (slow, stopping):
            listener.offer("engine", "{}")
        slow.offer("steps", "[]")
        slow.offer("steps", "[]")  # the third: over the backlog
        stopping.close()
        return await read(slow), await read(stopping)

    assert asyncio.run(run()) == (["dropped"], ["engine", "end"])


def test_an_open_stream_ends_when_the_server_stops_and_does_not_hold_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = ServerConfig(
        model=demo_model(tmp_path_factory),
        engine={"tiers": TIERS, "max_batch": 1},
        api_key=KEY,
    )
    server = LiveServer(config, grace=30.0)  # a stream that held the server would wait 30 s
    with server:
        reader = Reader(server.url)
        reader.wait_for("engine")
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10
    reader.thread.join(timeout=10)
    assert [n for n, _ in reader.events] == ["engine", "end"]
