"""Runs documented commands for test_docs.py: placeholders filled, one scratch dir per block."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from doc_blocks import Block, Command, commands, synth_paths
from docs_helpers import BIN, ROOT, free_port, report, subprocess_env

TIMEOUT = 240  # seconds per command (README commands take < 30 s on a loaded VM)
# directories the docs write: the OUT placeholder, and README's `demo-int4` (a name a reader's
# paste creates in the repository; the tests put it in the block's scratch directory)
OUTPUTS = ("OUT", "demo-int4")


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w./-]){re.escape(name)}(?![\w.-])")


def substitute(text: str, values: dict[str, str]) -> str:
    """`text` with each placeholder (a whole word) replaced; `make X` uses the installed edge0."""
    for name, value in values.items():
        text = _word(name).sub(value.replace("\\", "\\\\"), text)
    if re.match(r"make(\s|$)", text):
        text = f"make BIN={BIN} -o {BIN}/edge0" + text[len("make") :]
    return text


def substitute_ports(text: str, ports: dict[str, str]) -> str:
    """Documented server ports (in `--port N` and in `host:N` URLs) -> the free ones."""
    for documented, free in ports.items():
        text = re.sub(rf"(--port[ =]){documented}\b", rf"\g<1>{free}", text)
        if documented != "0":
            text = re.sub(rf"(?<=[\w\]]:){documented}\b", free, text)
    return text


def _shell(text: str, **kw: object) -> subprocess.Popen[str]:
    """bash running `text` in its own process group (so a timeout can stop all of it)."""
    return subprocess.Popen(
        ["bash", "-c", "set -euo pipefail\n" + text],
        cwd=ROOT,
        env=subprocess_env(),
        text=True,
        start_new_session=True,
        **kw,
    )  # type: ignore[call-overload]


def _stop(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class DocRunner:
    """Runs a block's commands in order, once each; keeps background servers until close()."""

    def __init__(self, scratch: Path, model: Path) -> None:
        self.scratch = scratch
        self.model = model
        self._values: dict[tuple[str, int], dict[str, str]] = {}
        self._done: dict[tuple[str, int, int], subprocess.CompletedProcess[str]] = {}
        self._ports: dict[tuple[str, int], dict[str, str]] = {}
        self._servers: list[subprocess.Popen[str]] = []

    def values(self, block: Block) -> dict[str, str]:
        """The placeholders of `block` -> real paths (and ports), made on first use."""
        key = (block.file, block.line)
        if key not in self._values:
            d = self.scratch / f"{Path(block.file).stem}-{block.line}"
            d.mkdir(parents=True)
            (d / "prompt.txt").write_text("def parse(s):\n")
            for out in OUTPUTS:  # a block that does not convert into it gets the demo model
                if not re.search(rf"\bconvert\b.*(?<![\w./-]){out}\b", block.text):
                    (d / out).symlink_to(self.model, target_is_directory=True)
            values = {
                "SRC": str(ROOT / "edge0/data/teacher"),
                "MODEL": str(self.model),
                "prompt.txt": str(d / "prompt.txt"),
                "trace.json": str(d / "trace.json"),
                **{out: str(d / out) for out in OUTPUTS},
            }
            for i, (path, shape) in enumerate(synth_paths(block).items()):
                values[path] = str(_synth(shape, d / f"synth-{i}-{shape}"))
            self._values[key] = values
            documented = {c.port for c in commands(block) if c.port is not None}
            self._ports[key] = {port: str(free_port()) for port in sorted(documented)}
        return self._values[key]

    def run(self, cmd: Command) -> subprocess.CompletedProcess[str]:
        """Run `cmd` after the earlier unskipped commands of its block (each only once)."""
        for earlier in commands(cmd.block)[: cmd.index]:
            if not earlier.skip:
                res = self._run_one(earlier)
                assert res.returncode == 0, f"earlier command failed: {earlier.text}\n{report(res)}"
        return self._run_one(cmd)

    def _run_one(self, cmd: Command) -> subprocess.CompletedProcess[str]:
        key = (cmd.block.file, cmd.block.line, cmd.index)
        if key not in self._done:
            ports = self.ports(cmd.block)
            text = substitute_ports(substitute(cmd.text, self.values(cmd.block)), ports)
            if cmd.port is None:
                self._done[key] = foreground(text)
            else:
                port = ports[cmd.port]
                if cmd.port != "0":  # a bare port argument, as in `python -m http.server 8080`
                    text = re.sub(rf"(?<![\w.:]){cmd.port}(?![\w.])", port, text)
                if not re.search(rf"\b{port}\b", text):
                    text += f" --port {port}"  # `edge0 serve` on its default port
                log = self.scratch / f"server-{len(self._servers)}.log"
                self._done[key] = self._serve(text, int(port), log)
        return self._done[key]

    def ports(self, block: Block) -> dict[str, str]:
        """The block's documented server ports -> free ports of this machine."""
        self.values(block)
        return self._ports[(block.file, block.line)]

    def _serve(self, text: str, port: int, log: Path) -> subprocess.CompletedProcess[str]:
        with open(log, "w") as out:
            proc = _shell(text, stdout=out, stderr=subprocess.STDOUT)
        self._servers.append(proc)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return subprocess.CompletedProcess(text, 0, f"listening on {port}\n", "")
            except OSError:
                time.sleep(0.2)
        rc = proc.poll()
        why = f"never listened on {port}\n{log.read_text()}"
        return subprocess.CompletedProcess(text, 1 if rc in (None, 0) else rc, "", why)

    def close(self) -> None:
        for proc in self._servers:
            _stop(proc)


def foreground(text: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run `text`; past `timeout` its whole process group is stopped (exit -9, and why)."""
    proc = _shell(text, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        out, err = proc.communicate()
        err += (
            f"\ntimed out after {timeout} s: mark the block `<!-- ci: skip (why) -->` "
            "when it is slow, or `background` when it is a server"
        )
        return subprocess.CompletedProcess(text, -9, out, err)
    return subprocess.CompletedProcess(text, proc.returncode, out, err)


def _synth(shape: str, dst: Path) -> Path:
    cmd = [sys.executable, "-m", "edge0", "synth", "--shape", shape, str(dst)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, report(res)
    return dst
