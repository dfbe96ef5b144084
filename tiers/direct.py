"""`direct`: reads around the page cache: O_DIRECT (Linux), F_NOCACHE (macOS), else a warning."""

from __future__ import annotations

import errno
import mmap
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edge0.layout.manifest import Manifest
from edge0.log import get_logger
from tiers._disk import DiskTier, pread_full

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

log = get_logger("edge0.tiers.direct")

O_DIRECT: int | None = getattr(os, "O_DIRECT", None)
F_NOCACHE: int | None = getattr(fcntl, "F_NOCACHE", None)
ALIGN = 4096  # O_DIRECT needs buffer address, file offset and length aligned to this


def address(buf: memoryview) -> int:
    return int(np.frombuffer(buf, np.uint8).ctypes.data)


class DirectTier(DiskTier):
    """Reads records around the page cache, so a measured read is a device read.

    Record offsets and sizes are 16 KiB-aligned, so each read is one aligned
    request. O_DIRECT also needs an aligned destination: a 4096-aligned `dest`
    is read into directly; any other (MLX CPU buffers sit at address % 4096 ==
    24) goes through a per-thread aligned bounce buffer and one memcpy.
    `mode` says what this tier ended up doing: "o_direct", "f_nocache" or
    "buffered" (the fallback, e.g. on tmpfs, which refuses O_DIRECT).
    """

    name: ClassVar[str] = "direct"

    def __init__(self, model_dir: Path, manifest: Manifest, **options: Any) -> None:
        super().__init__(model_dir, manifest, **options)
        self.check_file_size(manifest.experts_file_size)
        self._local = threading.local()
        self._lock = threading.Lock()
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        self.mode = "buffered"
        self._fd = -1
        if O_DIRECT is not None:
            try:
                self._fd = os.open(self.path, flags | O_DIRECT)
                self.mode = "o_direct"
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._fallback(f"the filesystem refuses O_DIRECT ({exc.strerror})")
        if self._fd < 0:
            self._fd = os.open(self.path, flags)
            if O_DIRECT is None and F_NOCACHE is not None and fcntl is not None:
                fcntl.fcntl(self._fd, F_NOCACHE, 1)
                self.mode = "f_nocache"
            elif O_DIRECT is None:
                self._fallback("this OS has neither O_DIRECT nor F_NOCACHE")

    def _fallback(self, why: str) -> None:
        log.warning(
            "direct.fallback",
            file=str(self.path),
            reason=why,
            note="reading through the page cache like the pread tier; "
            "cold-read figures will include cache effects",
        )

    def _read_raw(self, offset: int, length: int, dest: memoryview) -> int:
        if self.mode != "o_direct":
            return pread_full(self._fd, dest, offset)
        try:
            if address(dest) % ALIGN == 0 and length % ALIGN == 0:
                return pread_full(self._fd, dest, offset, ALIGN)
            bounce = self._bounce(length)
            n = pread_full(self._fd, bounce, offset, ALIGN)
            dest[:n] = bounce[:n]
            return n
        except OSError as exc:  # some filesystems accept the open, then refuse the read
            if exc.errno != errno.EINVAL:
                raise
            with self._lock:
                if self.mode == "o_direct":
                    self._fallback(f"an O_DIRECT read failed ({exc.strerror})")
                    old, self._fd = self._fd, os.open(self.path, os.O_RDONLY)
                    self.mode = "buffered"
                    os.close(old)
            return pread_full(self._fd, dest, offset)

    def _bounce(self, length: int) -> memoryview:
        """This worker thread's page-aligned buffer of at least `length` bytes."""
        buf: mmap.mmap | None = getattr(self._local, "buf", None)
        if buf is None or len(buf) < length:
            size = -(-length // ALIGN) * ALIGN
            buf = mmap.mmap(-1, size)  # anonymous mappings are page-aligned
            self._local.buf = buf
        return memoryview(buf)[:length]

    def _close_files(self) -> None:
        os.close(self._fd)
