"""How long `edge0 serve` takes to stop a long prompt after its client disconnects.

    python docs/benchmarks/scripts/disconnect_prompt.py MODEL --prompt-len 2048 --after 30 \
        -- --mode route --top-k 4 --memory-budget 3GiB ...

Starts `edge0 serve MODEL` with the given flags and `--log-json`, sends one streaming
`/v1/completions` request with a prompt of about `--prompt-len` tokens (the bench's prompt
text), waits for the first expert read (the prompt's chunks have begun) and `--after` seconds
more, closes the connection, and times how long until the engine logs the request's
`request_done` (a poll every 20 ms: the figure is an upper bound). Then a one-token request
checks the engine serves again. Prints one JSON object (also to `--json`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import click
from sigterm_prompt import _prompt_text  # docs/benchmarks/scripts/ is on sys.path


def _lines(events: Path, name: str) -> list[dict[str, object]]:
    if not events.is_file():
        return []
    out = []
    for line in events.read_text(errors="replace").splitlines():
        if f'"event": "{name}"' in line:
            out.append(json.loads(line))
    return out


def _post(port: int, body: dict[str, object]) -> socket.socket:
    """The request sent on a raw socket, left open (the client reads nothing yet)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("model", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--prompt-len", default=2048, show_default=True)
@click.option("--after", default=30.0, show_default=True, help="Seconds after the first read.")
@click.option("--wait", default=900.0, show_default=True, help="Most seconds to the first read.")
@click.option("--port", default=8931, show_default=True)
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False))
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def main(
    model: Path,
    prompt_len: int,
    after: float,
    wait: float,
    port: int,
    json_out: str | None,
    flags: tuple[str, ...],
) -> None:
    text, tokens = _prompt_text(model, prompt_len)
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        cmd = [sys.executable, "-m", "edge0", "--log-json", str(events), "serve", str(model)]
        cmd += ["--port", str(port), *flags]
        err = open(Path(tmp) / "stderr", "w")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < wait:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                    break
                except OSError:
                    if proc.poll() is not None:
                        sys.exit(f"edge0 serve exited {proc.returncode}")
                    time.sleep(0.5)
            ready = time.monotonic() - t0
            reads0 = len(_lines(events, "read"))
            body = {"prompt": text, "max_tokens": 4, "stream": True, "temperature": 0}
            sock = _post(port, body)
            sent = time.monotonic()
            first = None
            while first is None and time.monotonic() - sent < wait:
                time.sleep(0.5)
                if len(_lines(events, "read")) > reads0:
                    first = time.monotonic() - sent
            if first is None:
                sys.exit(f"no expert read within {wait} s of the request")
            time.sleep(after)
            done0 = len(_lines(events, "request_done"))
            load = os.getloadavg()
            closed = time.monotonic()
            sock.close()
            stopped = None
            while stopped is None and time.monotonic() - closed < 120:
                time.sleep(0.02)
                if len(_lines(events, "request_done")) > done0:
                    stopped = time.monotonic() - closed
            done = _lines(events, "request_done")[-1] if stopped is not None else {}
            t1 = time.monotonic()
            again = json.loads(
                urllib.request.urlopen(
                    urllib.request.Request(
                        f"http://127.0.0.1:{port}/v1/completions",
                        data=json.dumps({"prompt": "def f(", "max_tokens": 1}).encode(),
                        headers={"Content-Type": "application/json"},
                    ),
                    timeout=600,
                ).read()
            )
            next_s = time.monotonic() - t1
        finally:
            proc.terminate()
            proc.wait()
            err.close()
    result = {
        "prompt_len": prompt_len,
        "prompt_tokens": tokens,
        "flags": list(flags),
        "server_ready_s": round(ready, 2),
        "first_read_after_request_s": round(first, 2),
        "disconnect_after_request_s": round(closed - sent, 2),
        "request_done_after_disconnect_s": None if stopped is None else round(stopped, 3),
        "finish_reason": done.get("finish_reason"),
        "next_request_s": round(next_s, 2),
        "next_request_text": again["choices"][0]["text"],
        "load_average_at_disconnect": load,
    }
    click.echo(json.dumps(result, indent=1))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
