"""Outside the server: `edge0 convert` and `edge0 run` stop on SIGTERM as on Ctrl-C (cleanup, exit
code 130); what a killed build left in the edge0 cache is swept on the next run, whichever process
left it, and a live build's is not; EDGE0_CACHE that cannot be used is one line before any work."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from server_helpers import demo_model

from edge0.cli.main import main
from edge0.layout.atomic import MARKER_FILE
from edge0.model import cache
from edge0.model.demo import default_model_path, teacher_path

EDGE0 = [sys.executable, "-c", "from edge0.cli.main import main; main()"]


def _default_sigint() -> None:  # a background job's children start with SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(
    args: list[str], env: dict[str, str] | None = None, stdout: Any = subprocess.PIPE
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*EDGE0, *args],
        env={**os.environ, **(env or {})},
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def _terminate_when(proc: subprocess.Popen[str], ready: object) -> tuple[str, str]:
    """SIGTERM `proc` as soon as `ready()` holds; its output after it exits."""
    deadline = time.monotonic() + 120
    while not ready() and proc.poll() is None:  # type: ignore[operator]
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.005)
    assert proc.poll() is None, "it finished before the signal"
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _partial(folder: Path, prefix: str, started: bool = False) -> bool:
    """A partial output (NAME.tmp-XXXXXXXX) of a name starting with `prefix` in `folder`
    (`started`: with its writer's marker in it, so the conversion is under way)."""
    return any(
        p.name.startswith(prefix)
        and ".tmp-" in p.name
        and (not started or (p / MARKER_FILE).exists())
        for p in folder.glob("*")
    )


def test_sigterm_during_convert_cleans_up_and_exits_130(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    proc = _start(["convert", str(teacher_path()), str(dst), "--compress", "zstd"])
    _, err = _terminate_when(proc, lambda: _partial(tmp_path, "out", started=True))
    assert proc.returncode == 130, err
    assert "edge0: interrupted" in err and "Traceback" not in err, err
    assert not dst.exists() and not _partial(tmp_path, "out")  # the partial output is gone


def test_sigterm_during_the_first_use_conversion_cleans_the_cache(tmp_path: Path) -> None:
    env = {"EDGE0_CACHE": str(tmp_path / "cache")}
    proc = _start(["run", "-p", "def f(x):", "--max-tokens", "4"], env)
    _, err = _terminate_when(proc, lambda: _partial(tmp_path / "cache", "demo-", started=True))
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_sigterm_while_streaming_stops_like_ctrl_c(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    model = demo_model(tmp_path_factory)
    out = tmp_path / "stdout.txt"
    args = ["run", str(model), "-p", "def f(x):", "--mode", "route", "--max-tokens", "100000"]
    with open(out, "w") as stdout:
        proc = _start([*args, "--tiers", "throttle:bw=2MB/s>pread", "--no-chat"], stdout=stdout)
        _, err = _terminate_when(proc, lambda: out.read_text().strip())  # decoding: text is out
    assert proc.returncode == 130, err
    assert "edge0: interrupted" in err and "decode" in err and "Traceback" not in err, err


def _leftover(folder: Path, name: str, pid: int, host: str | None = None) -> Path:
    path = folder / name
    path.mkdir(parents=True)
    marker = {"pid": pid, "host": host or socket.gethostname(), "written_by": "edge0"}
    (path / MARKER_FILE).write_text(json.dumps(marker))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process has it now (a reuse this soon is not expected)


def test_the_next_run_sweeps_any_dead_builds_leftovers_and_no_live_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead, alive = _dead_pid(), os.getpid()
    gone = [
        _leftover(tmp_path, "demo-student-abc.tmp-a1b2c3d4", dead),
        _leftover(tmp_path, f"demo-student-abc.build-{dead}", dead),  # an older release's
        _leftover(tmp_path, f"demo-student-abc.build-{dead}.tmp-zzzzzzzz", dead),
        _leftover(tmp_path / "hub" / "org--m", "0123-abcd.tmp-q1w2e3r4", dead),
    ]
    kept = [
        _leftover(tmp_path, "demo-student-abc.tmp-livelive", alive),  # a build running now
        _leftover(tmp_path, "demo-student-abc.tmp-otherhst", dead, host="elsewhere"),
        tmp_path / "demo-student-abc",  # a finished entry
        tmp_path / "tune" / "0123456789abcdef",  # tune's resumable work
    ]
    young = tmp_path / "hub" / "org--m" / "0123-abcd.tmp-justmade"  # no marker yet
    for path in (*kept[2:], young):
        path.mkdir(parents=True)
    monkeypatch.setenv("EDGE0_CACHE", str(tmp_path))
    assert default_model_path().parent == tmp_path  # the next run: it sweeps, then builds
    assert all(not p.exists() for p in gone) and all(p.exists() for p in [*kept, young])
    assert cache.sweep(tmp_path) == []


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_an_unusable_edge0_cache_is_one_line(tmp_path: Path, kind: str) -> None:
    bad = tmp_path / "cache"
    if kind == "file":
        bad.write_text("not a directory")
    else:
        bad.symlink_to(tmp_path / "nowhere")
    r = CliRunner().invoke(main, ["run", "-p", "hi"], env={"EDGE0_CACHE": str(bad)})
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"edge0: error: EDGE0_CACHE={bad} is ")
    assert ("regular file" if kind == "file" else "nowhere, which does not exist") in r.output


def test_an_unwritable_edge0_cache_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kw: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache.tempfile, "mkstemp", refuse)  # root may write anywhere
    r = CliRunner().invoke(main, ["run", "-p", "hi"], env={"EDGE0_CACHE": str(tmp_path)})
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "cannot be written: Permission denied" in r.output
