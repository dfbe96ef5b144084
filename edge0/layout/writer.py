"""Append expert records to experts.bin (and experts.zst), computing each record's CRC32."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np

from edge0.layout.crc import crc32
from edge0.layout.manifest import EXPERTS_FILE, ZSTD_FILE, ZSTD_INDEX_FILE


class RecordWriter:
    """Writes fixed-size records in record order.

    With `zstd_level` set, every record is also compressed as one zstd frame into
    experts.zst, and experts.zst.idx gets one little-endian (offset, length) uint64 pair
    per record.
    """

    def __init__(
        self, directory: Path, record_size: int, zstd_level: int | None = None, header: bytes = b""
    ) -> None:
        """`header` is written before the first record (the manifest's `data_offset` bytes)."""
        self.record_size = record_size
        self.zstd_level = zstd_level
        self.crc32: list[int] = []
        self._bin: BinaryIO = open(Path(directory) / EXPERTS_FILE, "wb")  # noqa: SIM115
        self._bin.write(header)
        self._zst: BinaryIO | None = None
        self._index: list[tuple[int, int]] = []
        self._zst_offset = 0
        self._dir = Path(directory)
        self._zero_crc: int | None = None
        if zstd_level is not None:
            import zstandard

            self._compressor = zstandard.ZstdCompressor(level=zstd_level, write_content_size=True)
            self._zst = open(self._dir / ZSTD_FILE, "wb")  # noqa: SIM115

    def write(self, record: np.ndarray) -> int:
        """Append one record (uint8, exactly record_size bytes); returns its CRC32."""
        if record.nbytes != self.record_size:
            raise ValueError(f"record has {record.nbytes} bytes, expected {self.record_size}")
        mem = np.ascontiguousarray(record).reshape(-1).view(np.uint8).data
        crc = crc32(mem)
        self._bin.write(mem)
        if self._zst is not None:
            frame = self._compressor.compress(mem)
            self._zst.write(frame)
            self._index.append((self._zst_offset, len(frame)))
            self._zst_offset += len(frame)
        self.crc32.append(crc)
        return crc

    def write_hole(self) -> int:
        """Append one all-zero record as a hole (a sparse experts.bin); returns its CRC32.

        Nothing is written: the file's size grows when it is closed, and reads of the
        hole return zeros. Not with zstd (a frame would have to be written anyway).
        """
        if self._zst is not None:
            raise ValueError("a hole record cannot be compressed into experts.zst")
        if self._zero_crc is None:
            self._zero_crc = crc32(bytes(self.record_size))
        self._bin.seek(self.record_size, os.SEEK_CUR)
        self.crc32.append(self._zero_crc)
        return self._zero_crc

    def close(self) -> None:
        if not self._bin.closed:
            self._bin.truncate()  # the file ends where the records do, trailing holes included
        for f in (self._bin, self._zst):
            if f is not None and not f.closed:
                f.flush()
                os.fsync(f.fileno())
                f.close()
        if self._zst is not None:
            np.asarray(self._index, dtype="<u8").reshape(-1, 2).tofile(self._dir / ZSTD_INDEX_FILE)

    @property
    def zstd_bytes(self) -> int:
        return self._zst_offset

    def compression(self) -> dict[str, Any] | None:
        """The manifest's `compression` entry for what was written (None without zstd)."""
        if self.zstd_level is None:
            return None
        return {
            "codec": "zstd",
            "level": self.zstd_level,
            "file": ZSTD_FILE,
            "index": ZSTD_INDEX_FILE,
            "bytes": self._zst_offset,
        }

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            for f in (self._bin, self._zst):
                if f is not None:
                    f.close()
