"""A memory cgroup (v1 or v2, page cache counted) to run a command in, and what it used
(tools/memcap.py, `edge0 bench budget`)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

V1 = Path("/sys/fs/cgroup/memory")
V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


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
