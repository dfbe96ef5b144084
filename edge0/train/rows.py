"""Rows of memory-mapped traces read by parallel preads, not by page faults.

Head training samples a few thousand (window, token) rows a step from traces that can be
larger than the memory budget (2.6 GB of hidden states for 16k tokens of a 35B model).
Read through the memory map, each row is a page fault served one at a time, and each
fault's read-around pulls in pages that a capped page cache evicts before they are used:
on that model under a 1 GiB cap a step read 22 GB. `take` reads exactly the rows' bytes
instead, with `pread` from a few threads (the disk sees a queue, not one request at a
time) and the kernel's read-ahead off for those files. Arrays in memory are indexed as
before; the result is the same array `arr[seqs, layer, pos]` would give.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

THREADS = 8  # reads in flight; each waits on the disk with the GIL released
CHUNK = 256  # rows a task
_pool: ThreadPoolExecutor | None = None
_fds: dict[tuple[str, int, int], int] = {}  # (path, device, inode): a replaced file reopens
_lock = threading.Lock()


def take(arr: np.ndarray, seqs: np.ndarray, layer: int, pos: np.ndarray) -> np.ndarray:
    """`arr[seqs, layer, pos]` of a 4-D array (n, L, S, X): rows of X values."""
    where = _file_of(arr)
    if where is None:
        return np.asarray(arr[seqs, layer, pos])
    fd, start = where
    s0, s1, s2, _ = arr.strides
    seqs = np.asarray(seqs, dtype=np.int64)
    pos = np.asarray(pos, dtype=np.int64)
    n, layers, span, width = arr.shape
    if seqs.size and (seqs.min() < -n or seqs.max() >= n or pos.min() < -span or pos.max() >= span):
        raise IndexError(f"rows outside the traces' {n} windows of {span} tokens")
    if not -layers <= layer < layers:
        raise IndexError(f"layer {layer} outside the traces' {layers} layers")
    offsets = start + (seqs % n) * s0 + (layer % layers) * s1 + (pos % span) * s2
    out = np.empty((len(offsets), width), dtype=arr.dtype)
    order = np.argsort(offsets, kind="stable")  # ascending on disk within each task
    tasks = [order[i : i + CHUNK] for i in range(0, len(order), CHUNK)]
    for _ in _executor().map(lambda rows: _read(fd, offsets, out, rows), tasks):
        pass
    return out


def _read(fd: int, offsets: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
    size = out.shape[1] * out.itemsize
    for r in rows.tolist():
        view = memoryview(out[r]).cast("B")
        got = os.preadv(fd, [view], int(offsets[r]))
        if got != size:
            raise OSError(f"short read of a trace row ({got} of {size} bytes); the file is cut")


def _file_of(arr: np.ndarray) -> tuple[int, int] | None:
    """(fd, the file offset of arr's first element) for a row-contiguous view of a read-only
    np.memmap; None for anything else (arrays in memory, writable maps, odd strides)."""
    if not hasattr(os, "preadv") or arr.ndim != 4 or arr.strides[3] != arr.itemsize:
        return None
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not isinstance(root, np.memmap) or root.filename is None or root.mode != "r":
        return None
    if any(s < 0 for s in arr.strides):
        return None
    start = root.offset + (arr.ctypes.data - root.ctypes.data)
    return _fd(str(root.filename)), start


def _fd(path: str) -> int:
    st = os.stat(path)
    key = (path, st.st_dev, st.st_ino)
    with _lock:
        fd = _fds.get(key)
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead around rows
            _fds[key] = fd
        return fd


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="edge0-rows")
        return _pool


def close() -> None:
    """Close the trace files opened here (a tune's traces, once its heads are trained)."""
    with _lock:
        for fd in _fds.values():
            os.close(fd)
        _fds.clear()
