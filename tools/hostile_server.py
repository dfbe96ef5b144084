"""Send the hostile requests of docs/reliability.md to a live `edge0 serve` and print the table.

Starts `edge0 serve` (the demo model, a free port, a --trace file) in a fresh process,
sends each request, then stops it with SIGTERM mid-stream; prints one markdown row per
case: the HTTP status and the start of the answer, or the command's exit code, its
last line and whether the server logged a traceback.

    .venv/bin/python tools/hostile_server.py
    .venv/bin/python tools/hostile_server.py --code-dir /path/to/old/checkout   # another version
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click
import httpx

EDGE0 = [sys.executable, "-c", "from edge0.cli.main import main; main()"]
CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
REF_LOOP = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}
ITEM = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
ORDER = {"$defs": {"Item": ITEM}, "properties": {"item": {"$ref": "#/$defs/Item"}}}
PYDANTIC_TOOL = [{"type": "function", "function": {"name": "order", "parameters": ORDER}}]


def field(body: dict, name: str, raw: str) -> bytes:
    """`body` as JSON with field `name` set to the raw JSON text `raw`."""
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in body.items() if k != name]
    return ("{" + ", ".join([*fields, f'"{name}": {raw}']) + "}").encode()


CASES = [  # (label, path, raw body)
    (
        "deep JSON (100,000 nested arrays)",
        "/v1/completions",
        field({"prompt": "x"}, "prompt", "[" * 100_000 + "]" * 100_000),
    ),
    ("deep JSON (65 levels)", "/v1/chat/completions", field(CHAT, "messages", "[" * 65 + "]" * 65)),
    ("lone surrogate in a prompt", "/v1/completions", b'{"prompt": "a\\ud800", "max_tokens": 2}'),
    (
        "lone surrogate in a chat message",
        "/v1/chat/completions",
        field(CHAT, "messages", '[{"role": "user", "content": "\\udc00"}]'),
    ),
    (
        "lone surrogate in an Anthropic message",
        "/v1/messages",
        field(CHAT, "messages", '[{"role": "user", "content": "\\udc00"}]'),
    ),
    (
        "integer literal of 5,000 digits",
        "/v1/completions",
        field({"prompt": "x"}, "max_tokens", "9" * 5000),
    ),
    ("NaN literal", "/v1/completions", field({"prompt": "x"}, "temperature", "NaN")),
    ("a UTF-16 body", "/v1/chat/completions", json.dumps(CHAT).encode("utf-16")),
    ("the body `null`", "/v1/completions", b"null"),
    (
        'response_format `{"$ref": "#"}`',
        "/v1/chat/completions",
        field(CHAT, "response_format", json.dumps(REF_LOOP)),
    ),
    (
        "a forced tool whose schema uses `$defs` (pydantic)",
        "/v1/chat/completions",
        json.dumps(
            {**CHAT, "max_tokens": 40, "tools": PYDANTIC_TOOL, "tool_choice": "required"}
        ).encode(),
    ),
    (
        "an Anthropic tool without input_schema",
        "/v1/messages",
        json.dumps({**CHAT, "tools": [{"name": "f"}]}).encode(),
    ),
    (
        "an Anthropic conversation starting with the assistant",
        "/v1/messages",
        field(CHAT, "messages", '[{"role": "assistant", "content": "hi"}]'),
    ),
    (
        "an OpenAI user message with content null",
        "/v1/chat/completions",
        field(CHAT, "messages", '[{"role": "user", "content": null}]'),
    ),
]
RAW = [  # (label, bytes sent on a connection that then waits for the answer)
    (
        "a Content-Length of 19 digits, no body",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 19 + b"\r\n\r\n",
    ),
    ("a request head that never ends", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"),
]


def start(args: list[str], cwd: str | None) -> tuple[subprocess.Popen[str], str, list[str]]:
    """The server process, its URL and its stderr lines (read all along: a full pipe would
    stall a server that logs tracebacks)."""
    proc = subprocess.Popen(
        [*EDGE0, "serve", "--port", "0", *args], cwd=cwd, text=True, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    lines: list[str] = []
    while line := proc.stderr.readline():
        lines.append(line)
        if match := re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line):
            threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True).start()
            return proc, match.group(1), lines
    raise SystemExit(f"edge0 serve did not start (exit {proc.wait()})")


def drop_mid_upload(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
            b'\r\n{"prompt": "' + b"x" * 1000
        )
    time.sleep(1.0)


def raw_status(url: str, request: bytes) -> str:
    """The status line's code of the answer to `request` sent on its own connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request)
        try:
            reply = sock.recv(4096)
        except TimeoutError:
            return "no answer in 60 s"
    return reply.split(b" ", 2)[1].decode() if reply.startswith(b"HTTP/") else "closed"


def row(label: str, status: str, text: str, after: str = "") -> None:
    text = text.replace("|", "/").replace("\n", " ")[:150]
    print(f"| {label} | {status} | {text} | {after} |")


@click.command()
@click.option("--code-dir", default=None, help="Run `edge0 serve` from this checkout.")
def main(code_dir: str | None) -> None:
    trace = Path(tempfile.mkdtemp(prefix="edge0-hostile-server-")) / "trace.json"
    args = ["--trace", str(trace)]
    if code_dir is None:  # this version's limits, short enough for a table (the defaults: 10 s)
        args += ["--header-timeout", "2"]
    proc, url, log = start(args, code_dir)
    print("| case | status / exit | answer (start) | after |")
    print("|---|---|---|---|")
    with httpx.Client(base_url=url, timeout=120) as client:
        for label, path, raw in CASES:
            try:
                r = client.post(path, content=raw)
            except httpx.HTTPError as exc:
                row(f"`{label}` ({path})", "-", f"no answer ({type(exc).__name__})")
                continue
            row(f"`{label}` ({path})", str(r.status_code), r.text)
        for label, raw in RAW:
            sent = time.monotonic()
            status = raw_status(url, raw)
            row(f"`{label}`", status, f"answered in {time.monotonic() - sent:.1f} s")
        drop_mid_upload(url)
        row("client drops mid-upload", "-", "")
        for method, path in (("GET", "/v2/nowhere"), ("BREW", "/v1/messages")):
            row(f"`{method} {path}`", str(client.request(method, path).status_code), "")
        metrics = client.get("/metrics").text
        counted = re.findall(
            r'edge0_http_responses_total\{method="(\w+)",route="([^"]+)",'
            r'status="(\d+)"\} (\S+)',
            metrics,
        )
        summary = ", ".join(f"{m} {r} {s}: {float(n):g}" for m, r, s, n in counted)
        print(f"| /metrics: responses counted | - | {summary or '(none)'} | |")
        events: list[str] = []

        def stream() -> None:
            body = {"prompt": "def f(x):", "max_tokens": 300, "stream": True}
            try:
                with client.stream("POST", "/v1/completions", json=body) as r:
                    events.extend(ln[6:] for ln in r.iter_lines() if ln.startswith("data: "))
            except httpx.HTTPError as exc:
                events.append(f"{type(exc).__name__}")

        reader = threading.Thread(target=stream)
        reader.start()
        while not events:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        reader.join()
    time.sleep(0.5)  # the last lines of stderr
    lines = [ln.rstrip() for ln in log if ln.strip() and "PyTorch" not in ln]
    tracebacks = sum("Traceback" in ln for ln in lines)
    row(
        "SIGTERM mid-stream (300 tokens asked)",
        str(proc.returncode),
        (lines[-1] if lines else "") + f" — the stream's last event: {events[-1][:80]}",
        f"trace written: {trace.is_file()}; tracebacks logged: {tracebacks}",
    )


if __name__ == "__main__":
    main()
