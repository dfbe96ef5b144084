"""The clients of tools/bench/serve_load.py: normal streaming chat, slowloris, oversized/malformed.

Each kind runs as one asyncio task per concurrent connection and loops until the deadline,
recording every answer in a `Tally` (status counts, resets, TTFTs). A reset is any
connection error or a connection closed without an answer; a slow or bad client reads
the server's answer before it sends more, as a client that honours an early answer does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import random
import time
from typing import Any

import httpx

PROMPTS = [
    "def parse_args(argv):",
    "class LRUCache:",
    "import os\nimport sys\n",
    "def read_config(path):",
    "# Tokenize the input",
    "async def fetch(url):",
    "def test_roundtrip():",
    "class Node:\n    def __init__(self",
]


class Tally:
    """What one kind of client saw."""

    def __init__(self) -> None:
        self.status: collections.Counter[int] = collections.Counter()
        self.resets: list[str] = []
        self.ttft: list[float] = []  # seconds, successful normal requests
        self.retry_after_missing = 0
        self.done = 0  # normal requests that streamed to [DONE]

    def summary(self) -> dict[str, Any]:
        return {
            "status": dict(sorted(self.status.items())),
            "resets": len(self.resets),
            "reset_samples": self.resets[:5],
            "retry_after_missing": self.retry_after_missing,
            "completed": self.done,
        }


async def normal(client: httpx.AsyncClient, url: str, deadline: float, tally: Tally) -> None:
    """Streaming chat requests one after another; a 429 waits its Retry-After, then retries."""
    i = random.randrange(1 << 30)
    while time.monotonic() < deadline:
        i += 1
        body = {
            "model": "edge0-demo",
            "max_tokens": 16,
            "temperature": 0.7,
            "seed": i,
            "stream": True,
            "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        }
        start = time.monotonic()
        try:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                tally.status[r.status_code] += 1
                if r.status_code == 429:
                    wait = r.headers.get("retry-after")
                    if wait is None:
                        tally.retry_after_missing += 1
                    await r.aread()
                    await asyncio.sleep(float(wait or 1) * random.uniform(1.0, 1.5))
                    continue
                first = None
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data: {") and '"content": "' in line:
                        first = time.monotonic() - start
                    if line == "data: [DONE]":
                        tally.done += 1
                if first is not None:
                    tally.ttft.append(first)
        except httpx.HTTPError as exc:
            tally.resets.append(f"normal: {type(exc).__name__}: {exc}")


async def _exchange(url: str, send: Any, timeout: float = 120.0) -> int | None:
    """Open a connection and read the answer to EOF while `send(writer, answered)` talks
    (`answered` is set at the answer's first byte); the status, None if closed without one."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answered = asyncio.Event()
    chunks: list[bytes] = []

    async def read() -> None:
        while chunk := await reader.read(65536):
            chunks.append(chunk)
            answered.set()
        answered.set()  # EOF counts: nothing more will come

    reading = asyncio.ensure_future(read())
    try:
        async with asyncio.timeout(timeout):
            await send(writer, answered)
            await reading
    finally:
        reading.cancel()
        writer.close()
    raw = b"".join(chunks)
    if not raw.startswith(b"HTTP/1.1 "):
        return None
    return int(raw.split(b" ", 2)[1])


async def _trickle(writer: asyncio.StreamWriter, answered: asyncio.Event, data: bytes) -> None:
    """Send `data` a byte a second until the server answers."""
    for byte in data:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(answered.wait(), 1.0)
        if answered.is_set():
            return
        writer.write(bytes([byte]))
        await writer.drain()


async def _slow_head(head: bytes, w: asyncio.StreamWriter, answered: asyncio.Event) -> None:
    await _trickle(w, answered, head * 100)


async def _slow_body(head: bytes, w: asyncio.StreamWriter, answered: asyncio.Event) -> None:
    w.write(head)
    await _trickle(w, answered, b'{"messages": ' + b" " * 4000)


async def slowloris(url: str, key: str, deadline: float, tally: Tally) -> None:
    """Heads (or bodies) sent a byte a second, over and over; each should end in a 408."""
    start = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
    body_head = f"{start}Content-Length: 4000\r\nConnection: close\r\n\r\n".encode()
    while time.monotonic() < deadline:
        if random.random() < 0.5:
            send = functools.partial(_slow_head, start.encode())
        else:
            send = functools.partial(_slow_body, body_head)
        await _record(url, send, tally, "slowloris")


def _bad_requests(key: str) -> list[tuple[str, bytes, bytes]]:
    """(label, head, body) of the oversized and malformed requests."""

    def post(path: str, body: bytes, length: str | None = None, auth: bool = True) -> bytes:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\n"
        head += f"Authorization: Bearer {key}\r\n" if auth else ""
        head += f"Content-Length: {length or len(body)}\r\nConnection: close\r\n\r\n"
        return head.encode()

    big = json.dumps({"model": "m", "prompt": "x " * 450_000, "max_tokens": 4}).encode()
    utf16 = json.dumps({"model": "m", "prompt": "hi"}).encode("utf-16")
    null = json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user"}]}).encode()
    cases = [
        ("length of 20 digits", "/v1/completions", b"", "9" * 20, True),
        ("length of 30 digits", "/v1/messages", b"", "9" * 30, True),
        ("2 MiB body sent anyway", "/v1/completions", b"x" * (2 << 20), None, True),
        ("0.9 MB prompt (past the context)", "/v1/completions", big, None, True),
        ("UTF-16 body", "/v1/completions", utf16, None, True),
        ("content missing", "/v1/chat/completions", null, None, True),
        ("broken JSON", "/v1/messages", b"{nope", None, True),
        ("no API key", "/v1/completions", b"{}", None, False),
    ]
    out = [(label, post(path, body, n, auth), body) for label, path, body, n, auth in cases]
    out.append(("broken HTTP", b"POST /v1/messages HTTP/1.1\r\nbad header\r\n\r\n", b""))
    return out


async def _send_all(
    head: bytes, body: bytes, w: asyncio.StreamWriter, answered: asyncio.Event
) -> None:
    """The head, then the body in 64 KiB pieces, stopping at an early answer (a 413)."""
    w.write(head)
    await w.drain()
    for i in range(0, len(body), 64 << 10):
        if answered.is_set():
            return
        w.write(body[i : i + (64 << 10)])
        await w.drain()


async def bad(url: str, key: str, deadline: float, tally: Tally, pause: float) -> None:
    """Oversized and malformed requests, one per connection, `pause` seconds apart."""
    cases = _bad_requests(key)
    while time.monotonic() < deadline:
        _, head, body = random.choice(cases)
        await _record(url, functools.partial(_send_all, head, body), tally, "bad")
        await asyncio.sleep(pause * random.uniform(0.5, 1.5))


async def _record(url: str, send: Any, tally: Tally, kind: str) -> None:
    try:
        status = await _exchange(url, send)
    except (OSError, TimeoutError) as exc:
        tally.resets.append(f"{kind}: {type(exc).__name__}: {exc}")
        return
    if status is None:
        tally.resets.append(f"{kind}: closed without an answer")
    else:
        tally.status[status] += 1
