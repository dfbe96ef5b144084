"""Atomic, safe output directories: refuse DSTs that lose data; build in DST.tmp-x, rename."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edge0.errors import ConversionError
from edge0.layout.manifest import MANIFEST_FILE
from edge0.log import get_logger

log = get_logger(__name__)
MARKER_FILE = ".edge0-output"  # written into every atomic output: who writes it, from where
LEFTOVER = re.compile(r".+\.(tmp|old)-[A-Za-z0-9_]{8}")  # tempfile.mkdtemp's suffixes
YOUNG_S = 60.0  # a partial output without its marker this young may be a writer's first moment


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FREE_MARGIN = 0.05  # check_free_space asks for the output's size plus this share
FREE_SLACK = 1 << 28  # ... plus this many bytes


def check_free_space(dst: Path, need: int, what: str) -> None:
    """Refuse to start writing `need` bytes next to `dst` when the disk cannot hold them."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dst.parent).free
    margin = need * FREE_MARGIN + FREE_SLACK
    if free < need + margin:
        raise ConversionError(
            f"{dst.parent} has {free / 1e9:.2f} GB free; {what} needs {need / 1e9:.2f} GB plus "
            f"a margin of {margin / 1e9:.2f} GB ({FREE_MARGIN:.0%} + {FREE_SLACK >> 20} MiB, "
            "so the disk does not fill up to the last byte); free space or choose another DST"
        )


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def is_edge0_output(path: Path) -> bool:
    """A directory Edge0 wrote (a checkpoint with edge0.json, or any atomic output)."""
    return (path / MANIFEST_FILE).is_file() or (path / MARKER_FILE).is_file()


def check_destination(dst: Path, force: bool, src: Path | None = None) -> None:
    """Refuse a DST that would lose data.

    DST may not be SRC, inside SRC, or contain SRC (symlinks resolved). An existing DST
    needs `force`, and even then only an earlier Edge0 output or an empty directory is
    replaced.
    """
    dst = Path(dst)
    if src is not None:
        rs, rd = _resolved(Path(src)), _resolved(dst)
        if _within(rd, rs) or _within(rs, rd):
            how = "is" if rs == rd else ("is inside" if _within(rd, rs) else "contains")
            raise ConversionError(
                f"DST {dst} {how} SRC {src} (resolved: {rd} vs {rs}); writing there would "
                "destroy the source: choose a DST outside it"
            )
    if not (dst.exists() or dst.is_symlink()):
        return
    if not force:
        raise ConversionError(f"{dst} already exists; pass --force to replace it")
    if not dst.is_dir() or dst.is_symlink():
        raise ConversionError(
            f"{dst} is not a directory Edge0 wrote; --force replaces only an earlier Edge0 "
            "output or an empty directory: remove it yourself or choose another DST"
        )
    if not is_edge0_output(dst) and any(dst.iterdir()):
        raise ConversionError(
            f"{dst} is not empty and holds no {MANIFEST_FILE} (not an Edge0 output); --force "
            "replaces only an earlier Edge0 output or an empty directory: remove it yourself "
            "or choose another DST"
        )


def writer_alive(tmp: Path) -> bool:
    """Whether the process that created the temporary directory `tmp` may still run: its
    marker names a live process here or another host, or it is a partial output with no
    marker yet that is younger than YOUNG_S (its writer may be between mkdtemp and marker)."""
    try:
        info = json.loads((tmp / MARKER_FILE).read_text())
        pid, host = int(info["pid"]), str(info["host"])
    except (OSError, ValueError, KeyError, TypeError):
        if ".tmp-" not in tmp.name:  # a previous DST moved aside (.old-) has no marker
            return False
        try:
            return time.time() - tmp.stat().st_mtime < YOUNG_S  # between mkdtemp and marker
        except OSError:
            return False
    if host != socket.gethostname():
        return True  # cannot tell: leave it alone
    return pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers(dst: Path) -> list[Path]:
    """Remove what a killed writer left next to `dst`; returns what was removed.

    `DST.tmp-*` (a partial output) is removed when its writer is gone, else reported.
    `DST.old-*` (the previous DST, moved aside just before the final rename) is put back
    when DST is missing, else removed.
    """
    removed: list[Path] = []
    parent = Path(dst).parent
    if not parent.is_dir():
        return removed
    for entry in sorted(parent.iterdir()):
        name = entry.name
        if not entry.is_dir() or entry.is_symlink() or not LEFTOVER.fullmatch(name):
            continue
        if not name.startswith(f"{dst.name}."):
            continue
        if writer_alive(entry):
            log.warning("output.busy", path=str(entry), note="another writer is using it")
            continue
        previous = entry / dst.name
        if ".old-" in name and previous.is_dir() and not dst.exists():
            os.rename(previous, dst)
            log.warning("output.restored", path=str(dst), from_=str(previous))
        shutil.rmtree(entry, ignore_errors=True)
        log.warning("output.leftover_removed", path=str(entry))
        removed.append(entry)
    return removed


def _umask() -> int:
    """The process umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_directory(dst: Path, force: bool = False, src: Path | None = None) -> Iterator[Path]:
    """Yield a temporary directory that becomes `dst` only if the block finishes.

    On any exception (KeyboardInterrupt included) the temporary directory is removed
    and `dst` is left as it was; an OSError (a full disk, say) becomes a ConversionError.
    Leftovers of an earlier, killed writer are cleaned first (`clean_leftovers`).
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(dst)
    check_destination(dst, force, src)
    tmp = Path(tempfile.mkdtemp(prefix=f"{dst.name}.tmp-", dir=dst.parent))
    try:  # from here on an interrupt (Ctrl-C, SIGTERM) removes `tmp`
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes 0700; the output gets what mkdir gives
        marker = {"pid": os.getpid(), "host": socket.gethostname(), "written_by": "edge0"}
        (tmp / MARKER_FILE).write_text(json.dumps(marker) + "\n")
        yield tmp
        _fsync_tree(tmp)
        if dst.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{dst.name}.old-", dir=dst.parent))
            os.rename(dst, old / dst.name)
            os.rename(tmp, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dst)
        _fsync_dir(dst.parent)
        log.info("output.committed", path=str(dst))
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConversionError(
            f"writing {dst} failed: {exc.strerror or exc} ({exc.filename or tmp}); the partial "
            "output was removed: free space or fix the cause, then run again"
        ) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
