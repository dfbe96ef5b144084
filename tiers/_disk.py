"""Shared code of the disk tiers: worker pool, cancellation-safe thread hops, CRC check, retry."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from edge0.errors import CheckpointError, TierReadError
from edge0.layout.crc import crc32
from edge0.layout.manifest import EXPERTS_FILE, Manifest
from edge0.log import get_logger
from edge0.storage.spec import parse_bool, parse_int
from edge0.storage.tier import ExpertKey, ReadInfo

log = get_logger("edge0.tiers")
T = TypeVar("T")


class ReadFault(Exception):
    """A failed attempt (short read, CRC mismatch) that is worth one retry."""


def flat_bytes(dest: Any) -> memoryview:
    """`dest` (any writable C-contiguous buffer) as a flat uint8 memoryview."""
    mv = memoryview(dest)
    if mv.readonly:
        raise ValueError("read_into needs a writable buffer")
    if not mv.c_contiguous:
        raise ValueError("read_into needs a C-contiguous buffer")
    return mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv


def byte_view(dest: Any, size: int) -> memoryview:
    """`dest` as a flat writable uint8 memoryview of exactly `size` bytes."""
    mv = flat_bytes(dest)
    if mv.nbytes != size:
        raise ValueError(f"buffer holds {mv.nbytes} bytes, the record is {size}")
    return mv


async def run_in_pool(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
    """Run `fn(*args)` in `pool`; on cancellation, wait for the thread before re-raising.

    The thread writes into the caller's buffer: returning while it still runs
    would let the caller reuse a buffer that is being written.
    """
    fut = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        while not fut.done():
            try:
                await asyncio.wait([fut])
            except asyncio.CancelledError:
                continue
        if not fut.cancelled() and fut.exception() is not None:
            fut.exception()  # retrieved: no "exception never retrieved" warning
        raise


def check_crc(dest: memoryview, expected: int) -> None:
    got = crc32(dest)
    if got != expected:
        raise ReadFault(f"CRC32 mismatch (record {got:#010x}, manifest {expected:#010x})")


class DiskTier:
    """Base of tiers that read records from a file of the model directory.

    `verify`: True checks every record read against the manifest's CRC32,
    "once" only the first read of each record in this process, False never.
    Subclasses implement `_read_raw(offset, length, dest) -> bytes read`
    (blocking; it runs in a worker thread) and may override `_locate` (where a
    record is, for files other than experts.bin) and `_close_files`.
    """

    name: ClassVar[str] = "disk"
    WRAPS: ClassVar[bool] = False
    POSITIONAL: ClassVar[str | None] = None
    OPTIONS: ClassVar[dict[str, Callable[[str], Any]]] = {
        "verify": lambda t: "once" if t.strip().lower() == "once" else parse_bool(t),
        "workers": parse_int,
        "retries": lambda t: parse_int(t) if t.strip() != "0" else 0,
    }

    def __init__(
        self,
        model_dir: Path,
        manifest: Manifest,
        *,
        verify: bool | str = True,
        workers: int = 4,
        retries: int = 1,
        file: str = EXPERTS_FILE,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.manifest = manifest
        if verify not in (True, False, "once"):
            raise ValueError(f"verify must be True, False or 'once', got {verify!r}")
        self.verify = verify
        self._verified: set[int] = set()  # record indices already checked (verify="once")
        self.retries = retries
        self.path = self.model_dir / file
        if not self.path.is_file():
            raise CheckpointError(
                f"{self.path} not found; the tier {self.name!r} needs it (re-run `edge0 convert`)"
            )
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"tier-{self.name}")
        self._closed = False

    def check_file_size(self, expected: int) -> None:
        """Fail up front, naming the file, when it is shorter than the manifest says."""
        actual = self.path.stat().st_size
        if actual < expected:
            raise CheckpointError(
                f"{self.path} is {actual} bytes, the manifest needs {expected}: the file is "
                "truncated; re-run `edge0 convert`"
            )

    # --- the Tier interface ----------------------------------------------
    blocking: ClassVar[bool] = True  # `read_blocking` may be called from any thread

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        if self._closed:
            raise RuntimeError(f"tier {self.name!r} is closed")
        # one hop to a worker thread for the whole read, retries included
        return await run_in_pool(self._pool, self.read_blocking, key, dest)

    def read_blocking(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        """`read_into` on the calling thread (blocks it; thread-safe): the scheduler's own
        reader threads call it so that no read needs the event loop."""
        started = time.perf_counter()
        if self._closed:
            raise RuntimeError(f"tier {self.name!r} is closed")
        offset, length = self._locate(key)
        view = byte_view(dest, self.manifest.record_size)
        index = self.manifest.record_index(key.layer, key.expert)
        crc = self.manifest.crc32[index]
        check = self.verify is True or (self.verify == "once" and index not in self._verified)
        attempt = 0
        while True:
            attempt += 1
            try:
                self._attempt(offset, length, view, crc, check)
                break
            except (OSError, ReadFault) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                log.warning(
                    "tier.read_failed",
                    tier=self.name,
                    file=str(self.path),
                    layer=key.layer,
                    expert=key.expert,
                    offset=offset,
                    attempt=attempt,
                    reason=reason,
                )
                if attempt > self.retries:
                    raise TierReadError(
                        f"{reason} (after {attempt} attempts)",
                        file=str(self.path),
                        layer=key.layer,
                        expert=key.expert,
                        offset=offset,
                    ) from exc
        if check:
            self._verified.add(index)
        size = self.manifest.record_size
        finished = time.perf_counter()
        return ReadInfo(self.name, size, started, finished, attempts=attempt, disk_bytes=length)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._pool.shutdown, True)
        self._close_files()

    def close_sync(self) -> None:
        """Close without awaiting: only for a tier that never read (its stack failed to build)."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)
            self._close_files()

    # --- for subclasses --------------------------------------------------
    def _locate(self, key: ExpertKey) -> tuple[int, int]:
        """(file offset, bytes on disk) of the record of `key`."""
        return self.manifest.record_offset(key.layer, key.expert), self.manifest.record_size

    def _attempt(self, offset: int, length: int, dest: memoryview, crc: int, check: bool) -> None:
        n = self._read_raw(offset, length, dest)
        if n != dest.nbytes:
            raise ReadFault(f"short read ({n} of {dest.nbytes} bytes)")
        if check:  # crc32 (zlib-ng) releases the GIL; it is CPU time all the same
            check_crc(dest, crc)

    def _read_raw(self, offset: int, length: int, dest: memoryview) -> int:
        raise NotImplementedError

    def _close_files(self) -> None:
        pass


def pread_full(fd: int, dest: memoryview, offset: int, align: int = 1) -> int:
    """os.preadv until `dest` is full or the file ends; returns the bytes read.

    With `align` > 1 (O_DIRECT), a partial read that is not a multiple of
    `align` means end of file: the next request could not be aligned.
    """
    done = 0
    while done < dest.nbytes:
        n = os.preadv(fd, [dest[done:]], offset + done)
        done += n
        if n == 0 or n % align:
            break
    return done
