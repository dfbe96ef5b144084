"""The edge0 cache: where generated files go (the demo student, hub layouts, tune's traces), the
directory checked before any work, entries built into it atomically, and what a killed build
left behind swept on the next run, whichever process left it.

A build writes `NAME.tmp-XXXXXXXX` next to its entry and renames it into place
(edge0.layout.atomic); a process killed mid-build (SIGKILL, a crash, power) leaves that
directory, or an older release's `NAME.build-PID` staging. `sweep` removes those whose
writer is gone: the directory's marker names the writer's PID and host, and a writer still
running here (or on another host sharing the cache, or one too young to have written its
marker) is left alone, so a concurrent build is never deleted.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from edge0.errors import ConfigError
from edge0.layout.atomic import LEFTOVER, clean_leftovers, writer_alive
from edge0.log import get_logger

log = get_logger(__name__)
SUBDIRS = ("hub",)  # cache folders whose own folders hold built entries (hub/ORG--NAME/)
_OLD_STAGING = re.compile(r".+\.build-\d+")  # releases before the sweep staged in NAME.build-PID


def cache_dir() -> Path:
    """The edge0 cache ($EDGE0_CACHE, else $XDG_CACHE_HOME/edge0, else ~/.cache/edge0), created
    when missing. A ConfigError (one line) when it cannot be used: a regular file, a link to
    nothing, a directory this process cannot write."""
    if env := os.environ.get("EDGE0_CACHE"):
        path, name = Path(env).expanduser(), f"EDGE0_CACHE={env}"
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "edge0"
        name = f"the edge0 cache {path}"
    _check(path, name)
    return path


def _check(path: Path, name: str) -> None:
    fix = "point EDGE0_CACHE at a directory you can write"
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"{name} is a link to {os.readlink(path)}, which does not exist; {fix}")
    if path.exists() and not path.is_dir():
        kind = "a regular file" if path.is_file() else "not a directory"
        raise ConfigError(f"{name} is {kind}; {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe, probe_path = tempfile.mkstemp(prefix=".edge0-probe-", dir=path)
        os.close(probe)
        os.unlink(probe_path)
    except OSError as exc:
        mode = stat.filemode(path.stat().st_mode) if path.is_dir() else "missing"
        raise ConfigError(
            f"{name} cannot be written: {exc.strerror} ({mode}; this process runs as uid "
            f"{os.geteuid()}); {fix}"
        ) from None


def sweep(root: Path) -> list[Path]:
    """Remove what killed builds left in the cache `root` (and its SUBDIRS' folders); returns
    what was removed."""
    folders = [root] + [d for sub in SUBDIRS for d in _dirs(root / sub)]
    removed: list[Path] = []
    for folder in folders:
        for entry in _dirs(folder):
            if LEFTOVER.fullmatch(entry.name):
                dst = folder / re.split(r"\.(?:tmp|old)-", entry.name)[0]
                removed += clean_leftovers(dst)
            elif _OLD_STAGING.fullmatch(entry.name) and not writer_alive(entry):
                shutil.rmtree(entry, ignore_errors=True)
                log.warning("cache.leftover_removed", path=str(entry))
                removed.append(entry)
    return removed


def _dirs(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
