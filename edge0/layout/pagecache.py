"""Dropping a file's pages from the page cache (POSIX_FADV_DONTNEED): for benchmarks that
must start cold (a tier's reads, a run inside a memory cgroup), and for the files an engine
under a memory budget reads once at load and never again."""

from __future__ import annotations

import os
from pathlib import Path


def can_drop() -> bool:
    """Whether this platform can ask the kernel to drop a file's cached pages."""
    return hasattr(os, "posix_fadvise")


def drop(path: Path) -> None:
    """Ask the kernel to drop `path`'s cached pages (a missing file, or no fadvise: nothing)."""
    if not can_drop() or not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
