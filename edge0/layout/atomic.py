"""Atomic output directories: build in DST.tmp-xxxx next to DST, fsync, rename on success."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edge0.errors import ConversionError
from edge0.log import get_logger

log = get_logger(__name__)


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


def check_free_space(dst: Path, need: int, what: str) -> None:
    """Refuse to start writing `need` bytes next to `dst` when the disk cannot hold them."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dst.parent).free
    if free < need * 1.05 + (1 << 28):
        raise ConversionError(
            f"{dst.parent} has {free / 1e9:.1f} GB free, {what} needs {need / 1e9:.1f} GB; "
            "free space or choose another DST"
        )


def check_destination(dst: Path, force: bool) -> None:
    """Refuse an existing DST unless `force`."""
    if dst.exists() and not force:
        raise ConversionError(f"{dst} already exists; pass --force to replace it")


@contextmanager
def atomic_directory(dst: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `dst` only if the block finishes.

    On any exception (KeyboardInterrupt included) the temporary directory is removed
    and `dst` is left as it was.
    """
    dst = Path(dst)
    check_destination(dst, force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{dst.name}.tmp-", dir=dst.parent))
    try:
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
