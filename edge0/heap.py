"""The native heap of a long-running engine: large blocks mapped on their own, not kept in arenas.

glibc serves a block above its mmap threshold with its own mapping, returned to
the OS on free. The threshold starts at 128 KiB but follows the largest mapped
block freed so far (up to 32 MiB), so after the first prompt the multi-MiB
buffers of MLX (activations, dequantized weights) and the RAM tier's record
copies come from the arenas, where free space between live blocks stays
resident: RSS and its peak grew prompt after prompt (docs/benchmarks/prefill.md,
"The native-heap creep"). A fixed threshold turns that adjustment off.
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
_done = False


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's mmap threshold once per process (Linux with glibc; a no-op elsewhere or
    when MALLOC_MMAP_THRESHOLD_ is set). True when it is set now or was before."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux") or ENV in os.environ:
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    _done = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    log.debug("heap.mmap_threshold", bytes=threshold, set=_done)
    return _done
