"""The native heap of a long-running engine: a fixed mmap threshold, so large blocks are mapped
on their own, `limit_arenas` and `trim` (docs/memory.md, "The native heap across requests";
docs/server.md, "Memory").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

from edge0.log import get_logger

log = get_logger("edge0.heap")

M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc's malloc.h)
MMAP_THRESHOLD = 1 << 20  # blocks of 1 MiB and more are mapped on their own
ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc's own setting: when given, it wins
M_ARENA_MAX = -8  # mallopt parameter: the most arenas glibc creates
ARENA_ENV = "MALLOC_ARENA_MAX"
SERVER_ARENAS = 2  # `edge0 serve`: the main arena and one for all other threads
_done = False
_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc on Linux (it has mallopt and malloc_trim), else None."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c"))
            lib.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            lib.malloc_trim.argtypes = (ctypes.c_size_t,)
            _libc = lib
        except (OSError, AttributeError, TypeError):  # not glibc (musl has neither)
            return None
    return _libc


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's mmap threshold once per process (Linux with glibc; a no-op elsewhere or
    when MALLOC_MMAP_THRESHOLD_ is set). True when it is set now or was before."""
    global _done
    if _done:
        return True
    libc = _glibc()
    if libc is None or ENV in os.environ:
        return False
    _done = bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    log.debug("heap.mmap_threshold", bytes=threshold, set=_done)
    return _done


def limit_arenas(arenas: int = SERVER_ARENAS) -> bool:
    """Let glibc create at most `arenas` malloc arenas (call before the threads start; a
    no-op without glibc or when MALLOC_ARENA_MAX is set). A server's short-lived worker
    threads otherwise each get an arena whose free pages a live block can pin."""
    libc = _glibc()
    if libc is None or ARENA_ENV in os.environ:
        return False
    done = bool(libc.mallopt(M_ARENA_MAX, arenas))
    log.debug("heap.arena_max", arenas=arenas, set=done)
    return done


def trim() -> bool:
    """Give the free pages of glibc's arenas back to the OS (`malloc_trim(0)`); False where
    there is no glibc. It walks every arena: call it off the event loop, when idle."""
    libc = _glibc()
    if libc is None:
        return False
    released = bool(libc.malloc_trim(0))
    log.debug("heap.trimmed", released=released)
    return True
