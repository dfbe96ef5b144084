"""`edge0 run` with the streaming runtime: flags, trace file, summary, errors, Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge0 import log
from edge0.cli.main import main


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]  # the session's read-only store (conftest.py)


def test_run_streams_and_writes_trace_and_json_log(store: Path, tmp_path: Path) -> None:
    trace, logs = tmp_path / "t.json", tmp_path / "log.jsonl"
    args = [
        "run",
        str(store),
        "-p",
        "hello",
        "--max-tokens",
        "4",
        "--mode",
        "hint",
        "--top-k",
        "2",
        "--tiers",
        "ram:1MiB>pread",
        "--trace",
        str(trace),
        "--log-json",
        str(logs),
        "--sample-top-k",
        "0",
        "--stats",
        "full",
    ]
    try:
        res = CliRunner().invoke(main, args)
    finally:  # the JSON sink stays open for the process; close it for the next tests
        if log._json_sink is not None and log._json_sink is not sys.stderr:
            log._json_sink.close()
        log.configure("warning")
    assert res.exit_code == 0, res.output
    assert "blocked load" in res.output and "mode hint, exact (top-k 2" in res.output
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat", "").startswith("read.") for e in events)
    kinds = {json.loads(line)["event"] for line in logs.read_text().splitlines()}
    assert {"read", "compute", "request_done"} <= kinds


def test_streaming_modes_need_a_layout_dir(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    res = CliRunner().invoke(main, ["run", str(hf), "-p", "hi", "--mode", "route"])
    assert res.exit_code == 2 and "edge0-layout" in res.output


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_cleanly_with_stats_so_far(store: Path, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    edge0 = str(Path(sys.executable).parent / "edge0")
    cmd = [
        edge0,
        "run",
        str(store),
        "-p",
        "hello",
        "--no-chat",
        "--mode",
        "route",  # untrained heads: a long answer (exact mode's greedy one ends at once)
        "--max-tokens",
        "100000",
        "--tiers",
        "throttle:bw=1MB/s>pread",
        "--log-json",
        str(events),
    ]
    # a test run in a shell's background job inherits SIGINT ignored (no job control):
    # the child starts with the default action, as under a terminal
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # interrupt once it is generating (reads happen)
        if events.is_file() and '"event": "read"' in events.read_text():
            break
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:  # never leave the child (and its pipes) behind for later tests
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode()
    assert proc.returncode == 130, text
    assert "interrupted" in text and "decode" in text and "Traceback" not in text
