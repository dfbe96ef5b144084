"""`zstd`: per-record zstd frames from experts.zst, decompressed in worker threads into `dest`."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import zstandard

from edge0.errors import CheckpointError
from edge0.layout.manifest import ZSTD_FILE, ZSTD_INDEX_FILE, Manifest
from edge0.storage.tier import ExpertKey
from tiers._disk import DiskTier, ReadFault, pread_full


class ZstdTier(DiskTier):
    """Reads one compressed frame per record and decompresses it straight into `dest`.

    Side files (written by `edge0 convert --compress zstd`): `experts.zst`, one
    zstd frame per record in record order, and `experts.zst.idx`, little-endian
    uint64 (offset, length) pairs, one per record. zstandard releases the GIL
    while it decompresses, so the worker pool decompresses in parallel. The
    CRC is checked on the decompressed record, as for the other disk tiers.
    """

    name: ClassVar[str] = "zstd"

    def __init__(self, model_dir: Path, manifest: Manifest, **options: Any) -> None:
        comp = manifest.compression or {}
        if comp.get("codec") != "zstd":
            raise CheckpointError(
                f"{model_dir} has no zstd-compressed experts; write them with "
                "`edge0 convert --compress zstd`, or use another tier (pread, direct, mmap)"
            )
        super().__init__(model_dir, manifest, file=comp.get("file", ZSTD_FILE), **options)
        index_path = self.model_dir / comp.get("index", ZSTD_INDEX_FILE)
        try:
            index = np.fromfile(index_path, dtype="<u8")
        except OSError as exc:
            raise CheckpointError(f"{index_path} is unreadable ({exc}); re-run convert") from None
        if index.size != 2 * manifest.n_records:
            raise CheckpointError(
                f"{index_path} holds {index.size // 2} entries, the manifest has "
                f"{manifest.n_records} records; re-run `edge0 convert --compress zstd`"
            )
        self._index = index.reshape(-1, 2)  # (n_records, 2): offset, length
        self.check_file_size(int((self._index[:, 0] + self._index[:, 1]).max(initial=0)))
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._local = threading.local()

    def _locate(self, key: ExpertKey) -> tuple[int, int]:
        offset, length = self._index[self.manifest.record_index(key.layer, key.expert)]
        return int(offset), int(length)

    def _read_raw(self, offset: int, length: int, dest: memoryview) -> int:
        buf: bytearray | None = getattr(self._local, "frame", None)
        if buf is None or len(buf) < length:  # one frame buffer per thread, reused
            buf = self._local.frame = bytearray(length)
        frame = memoryview(buf)[:length]
        got = pread_full(self._fd, frame, offset)
        if got != length:
            raise ReadFault(f"short read of the compressed frame ({got} of {length} bytes)")
        dctx: zstandard.ZstdDecompressor | None = getattr(self._local, "dctx", None)
        if dctx is None:  # a decompression context per thread: they are not thread-safe
            dctx = self._local.dctx = zstandard.ZstdDecompressor()
        try:
            with dctx.stream_reader(frame) as reader:
                done = 0
                while done < dest.nbytes:
                    n = reader.readinto(dest[done:])
                    if n == 0:
                        break
                    done += n
                if done == dest.nbytes and reader.read(1):
                    raise ReadFault("the zstd frame decompresses to more than one record")
        except zstandard.ZstdError as exc:
            raise ReadFault(f"corrupt zstd frame ({exc})") from None
        return done

    def _close_files(self) -> None:
        os.close(self._fd)
