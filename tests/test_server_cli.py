"""`edge0 serve` as a command: listens on a free loopback port, takes EDGE0_API_KEY, answers,
stops cleanly on Ctrl-C and on SIGTERM; a bad model, a busy port or a bad option is a one-line
error with exit code 2."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from server_helpers import demo_model

from edge0.cli.main import main

EDGE0 = [sys.executable, "-c", "from edge0.cli.main import main; main()"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model(tmp_path_factory)


def test_serve_command_listens_checks_the_key_and_stops_on_ctrl_c(model: Path) -> None:
    env = {**os.environ, "EDGE0_API_KEY": "k-123"}
    proc = subprocess.Popen(
        [
            *EDGE0,
            "serve",
            str(model),
            "--port",
            "0",
            "--model-name",
            "demo",
            "--tiers",
            "ram:16MiB>pread",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT's default action, even when the tests run in a background job (ignored there)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stderr is not None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, f"edge0 serve exited: {''.join(lines)}"
            lines.append(line)
            if match := re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line):
                break
        assert match, lines
        url = match.group(1)
        assert httpx.get(url + "/health").status_code == 401
        r = httpx.post(
            url + "/v1/completions",
            headers={"Authorization": "Bearer k-123"},
            json={"prompt": "def f(x):", "max_tokens": 3, "temperature": 0},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["model"] == "demo"
        assert r.json()["usage"]["completion_tokens"] <= 3
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "edge0 serve: stopped" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_errors_are_one_line(model: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["serve", str(tmp_path)])
    assert r.exit_code == 2 and r.exception is None or isinstance(r.exception, SystemExit)
    assert r.output.startswith("edge0: error: ") and "edge0 convert" in r.output
    (tmp_path / "edge0.json").write_text('{"format_version": 1}')  # fails as the engine opens
    r = CliRunner().invoke(main, ["serve", str(tmp_path), "--port", "0"])
    assert r.exit_code == 2 and r.output.startswith("edge0: error: "), r.output
    assert "edge0.json" in r.output and "Traceback" not in r.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(main, ["serve", str(model), "--port", str(port)])
    assert r.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in r.output, r.output


def _start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """`edge0 serve ARGS` in a child process and its URL, once it listens."""
    proc = subprocess.Popen(
        [*EDGE0, "serve", *args, "--port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line, f"edge0 serve exited: {''.join(lines)}"
        lines.append(line)
        if match := re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line):
            return proc, match.group(1)
    proc.kill()
    raise AssertionError(lines)


def test_sigterm_stops_like_ctrl_c_finishing_requests_and_writing_the_trace(
    model: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.json"
    proc, url = _start([str(model), "--trace", str(trace), "--shutdown-grace", "60"])
    events: list[str] = []

    def stream() -> None:
        body = {"prompt": "def f(x):", "max_tokens": 16, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            events.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))

    reader = threading.Thread(target=stream)
    try:
        reader.start()
        deadline = time.monotonic() + 60
        while not events and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # mid-stream
        _, err = proc.communicate(timeout=120)
        reader.join(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "edge0 serve: stopped" in err and "Traceback" not in err, err
    assert events[-1] == "[DONE]", events  # the request in flight ended with its finish
    assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("length", "stop")
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-body", "abc"], "--max-body: 'abc' is not a size"),
        (["--max-body", "-1"], "--max-body: '-1' is not a size"),
        (["--max-body", "1e400"], "--max-body: '1e400' is too large"),
        (["--max-body", "0"], "give 1KiB to 1GiB"),
        (["--shutdown-grace", "nan"], "--shutdown-grace nan must be between"),
        (["--trace", "/missing-e0/t.json"], "--trace /missing-e0/t.json: directory"),
        (["--log-json", "/missing-e0/l.jsonl"], "--log-json /missing-e0/l.jsonl: directory"),
        (["--api-key", "k\u00e9y"], "--api-key 'k\u00e9y' cannot be sent over HTTP"),
        (["--io-workers", "1000"], "--io-workers (io_workers=) must be between 1 and 64"),
        (["--model-name", "a\udcff"], "--model-name 'a\\udcff' cannot be sent over HTTP"),
        (["--max-header-size", "abc"], "--max-header-size: 'abc' is not a size"),
        (["--max-header-size", "100"], "--max-header-size is 100 bytes; give 1KiB to 1MiB"),
    ],
)
def test_serve_checks_its_options_before_any_work(
    tmp_path: Path, args: list[str], words: str
) -> None:
    # MODEL is not even a directory: the options are refused before it is looked at
    r = CliRunner().invoke(main, ["serve", str(tmp_path / "nowhere"), *args])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("edge0: error: ") and r.output.count("\n") == 1, r.output
    assert words in r.output and "nowhere" not in r.output


def test_more_connections_than_open_files_allow_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 2048))
    r = CliRunner().invoke(main, ["serve", str(tmp_path / "nowhere"), "--max-connections", "4000"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "--max-connections 4000 needs 4256 open files" in r.output
    assert "at most 2048 (`ulimit -Hn`); lower --max-connections to 1792" in r.output
