"""edge0.layout.crc: zlib-ng's CRC-32 gives zlib's values, so existing manifests still check."""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edge0.layout.crc import crc32


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), start=st.integers(0, 2**32 - 1))
def test_crc32_equals_zlib(data: bytes, start: int) -> None:
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)


def test_crc32_of_a_record_view_and_in_pieces() -> None:
    rec = bytearray(np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes())
    view = memoryview(rec)
    want = zlib.crc32(view)
    assert crc32(view) == want
    assert crc32(view[1 << 20 :], crc32(view[: 1 << 20])) == want
    rec[12345] ^= 1
    assert crc32(view) != want
