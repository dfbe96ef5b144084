"""`crc32`, `file_crc32`: the layout's record and file checksum (zlib's CRC-32) by zlib-ng.

The same polynomial and values as `zlib.crc32`, so manifests written before read the
same. zlib-ng folds with carry-less multiplies (PCLMULQDQ on x86-64, PMULL on ARM):
about 4x the system zlib's rate here (docs/tiers.md, "Integrity and faults"), which
matters because every streamed expert record is checked by default. It releases the GIL.
"""

from __future__ import annotations

from pathlib import Path

from zlib_ng import zlib_ng

crc32 = zlib_ng.crc32
CHUNK = 64 * 1024 * 1024

__all__ = ["crc32", "file_crc32"]


def file_crc32(path: Path) -> int:
    """The CRC-32 of a whole file, read in CHUNK-sized pieces."""
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            crc = crc32(chunk, crc)
    return crc
