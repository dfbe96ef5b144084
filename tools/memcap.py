"""Run a command inside a memory-capped cgroup (page cache included) and report what it used.

    sudo python tools/memcap.py --limit 3GiB [--json out.json] -- edge0 run MODEL -p hi ...

Creates a cgroup with the limit (cgroup v1 `memory` controller, or cgroup v2 with
the memory controller enabled), starts the command in it, samples the cgroup's
usage, and prints: exit status, the cgroup's peak usage (anonymous memory and page
cache together, as the kernel charges them), the largest page cache seen, the
number of times the limit was hit, OOM kills, and the peak RSS: the largest VmHWM
of any process in the cgroup (sampled from /proc, and the command's own read just
before it is reaped), so a wrapper such as `/usr/bin/time -v CMD` still reports
CMD's peak, not the wrapper's. Needs root and a writable
cgroup hierarchy; anything else is a one-line error (exit 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge0.storage.spec import parse_size  # noqa: E402

V1 = Path("/sys/fs/cgroup/memory")
V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
_MIB = 1 << 20


class CapError(Exception):
    """A machine without a usable memory cgroup (the message says why)."""


class Cgroup:
    """One memory cgroup: v1 (`memory.limit_in_bytes`) or v2 (`memory.max`)."""

    def __init__(self, name: str, limit: int) -> None:
        self.v1 = (V1 / "memory.limit_in_bytes").exists()
        if self.v1:
            self.path = V1 / name
        else:
            root = next((r for r in V2_ROOTS if _v2_memory(r)), None)
            if root is None:
                raise CapError(
                    "no cgroup memory controller: neither /sys/fs/cgroup/memory (v1) nor a v2 "
                    "hierarchy with 'memory' in cgroup.subtree_control"
                )
            self.path = root / name
        try:
            self.path.mkdir()
            self._write("memory.limit_in_bytes" if self.v1 else "memory.max", str(limit))
            if self.v1 and (self.path / "memory.memsw.limit_in_bytes").exists():
                self._write("memory.memsw.limit_in_bytes", str(limit))  # no escape into swap
            elif not self.v1 and (self.path / "memory.swap.max").exists():
                self._write("memory.swap.max", "0")
        except PermissionError:
            raise CapError(f"cannot create {self.path}: run as root (cgroups need it)") from None

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def add_self(self) -> None:
        """Put the calling process in the cgroup (the child, before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def usage(self) -> int:
        return int(self._read("memory.usage_in_bytes" if self.v1 else "memory.current"))

    def stat(self) -> dict[str, int]:
        out = {}
        for line in self._read("memory.stat").splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value)
        return out

    def page_cache(self) -> int:
        s = self.stat()
        return s.get("cache", s.get("file", 0))

    def peak(self) -> int | None:
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        return int(self._read(name)) if (self.path / name).exists() else None

    def limit_hits(self) -> int:
        if self.v1:
            return int(self._read("memory.failcnt"))
        events = dict(ln.split() for ln in self._read("memory.events").splitlines())
        return int(events.get("max", 0))

    def oom_kills(self) -> int:
        if self.v1:
            ctl = dict(ln.split() for ln in self._read("memory.oom_control").splitlines())
            return int(ctl.get("oom_kill", 0))
        events = dict(ln.split() for ln in self._read("memory.events").splitlines())
        return int(events.get("oom_kill", 0))

    def pids(self) -> list[int]:
        """The processes in the cgroup now (a wrapper and whatever it started)."""
        try:
            return [int(p) for p in self._read("cgroup.procs").split()]
        except OSError:
            return []

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _v2_memory(root: Path) -> bool:
    ctl = root / "cgroup.subtree_control"
    return ctl.exists() and "memory" in ctl.read_text().split()


def _hwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def largest_hwm(pids: list[int]) -> int:
    """The largest VmHWM (bytes) among PIDS; 0 for none (a process gone is skipped)."""
    return max((_hwm(pid) or 0 for pid in pids), default=0)


def run_capped(cmd: list[str], limit: int, interval: float) -> dict[str, Any]:
    cg = Cgroup(f"edge0-memcap-{os.getpid()}", limit)
    samples: list[tuple[float, int, int]] = []
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, preexec_fn=cg.add_self)  # noqa: PLW1509 - joins the cgroup
        hwm: list[int] = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append((time.perf_counter() - start, cg.usage(), cg.page_cache()))
                hwm[0] = max(hwm[0], largest_hwm([proc.pid, *cg.pids()]))
                done.wait(interval)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        # wait without reaping, so /proc/PID/status is still there to read the final VmHWM
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        final = _hwm(proc.pid)
        done.set()
        thread.join()
        rc = proc.wait()
        return {
            "command": cmd,
            "limit": limit,
            "cgroup": str(cg.path),
            "exit": rc,
            "seconds": round(time.perf_counter() - start, 2),
            "peak_usage": cg.peak() or max((u for _, u, _ in samples), default=0),
            "peak_page_cache": max((c for _, _, c in samples), default=0),
            "limit_hits": cg.limit_hits(),
            "oom_kills": cg.oom_kills(),
            "peak_rss": max(hwm[0], final or 0),
            "samples": samples,
        }
    finally:
        cg.remove()


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--limit", required=True, help="Memory cap, page cache included, e.g. 3GiB.")
@click.option("--interval", default=0.2, show_default=True, help="Seconds between samples.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def main(limit: str, interval: float, json_out: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with its memory (anonymous + page cache) capped at LIMIT."""
    try:
        try:
            cap = parse_size(limit)
        except ValueError as exc:
            raise CapError(f"--limit: {exc}") from None
        out = run_capped(list(command), cap, interval)
    except CapError as exc:
        click.echo(f"memcap: error: {exc}", err=True)
        sys.exit(2)
    click.echo(
        f"memcap: limit {cap / _MIB:.0f} MiB ({out['cgroup']}): exit {out['exit']} after "
        f"{out['seconds']:.1f} s; cgroup peak {out['peak_usage'] / _MIB:.0f} MiB (RSS + page "
        f"cache), page cache up to {out['peak_page_cache'] / _MIB:.0f} MiB, limit hit "
        f"{out['limit_hits']} times, OOM kills {out['oom_kills']}; command peak RSS "
        f"{out['peak_rss'] / _MIB:.0f} MiB",
        err=True,
    )
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1) + "\n")
    sys.exit(out["exit"] if out["exit"] >= 0 else 128 - out["exit"])


if __name__ == "__main__":
    main()
