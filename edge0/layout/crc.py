"""`crc32`: the layout's record and file checksum (zlib's CRC-32), computed by zlib-ng.

The same polynomial and values as `zlib.crc32`, so manifests written before read the
same. zlib-ng folds with carry-less multiplies (PCLMULQDQ on x86-64, PMULL on ARM):
about 4x the system zlib's rate here (docs/tiers.md, "Integrity and faults"), which
matters because every streamed expert record is checked by default. It releases the GIL.
"""

from __future__ import annotations

from zlib_ng import zlib_ng

crc32 = zlib_ng.crc32

__all__ = ["crc32"]
