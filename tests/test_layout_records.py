"""Expert record layout: alignment, pack/unpack round trip, numpy views, manifest round trip."""

from __future__ import annotations

import numpy as np
import pytest

from edge0.errors import CheckpointError
from edge0.layout.manifest import Manifest
from edge0.layout.records import (
    FIELD_ALIGN,
    FIELD_NAMES,
    RECORD_ALIGN,
    field_views,
    pack_record,
    record_layout,
    unpack_record,
)


@pytest.mark.parametrize(
    ("d", "ff", "bits", "gs", "dt"),
    [
        (64, 32, 4, 32, "bfloat16"),
        (2048, 512, 4, 64, "bfloat16"),
        (128, 64, 8, 64, "float32"),
    ],
)
def test_layout_is_aligned_and_dense(d: int, ff: int, bits: int, gs: int, dt: str) -> None:
    spec = record_layout(d, ff, bits, gs, dt)
    assert [f.name for f in spec.fields] == list(FIELD_NAMES)
    assert spec.record_size % RECORD_ALIGN == 0
    item = np.dtype("float32" if dt == "float32" else "uint16").itemsize
    want = {"gate_proj": (ff, d), "up_proj": (ff, d), "down_proj": (d, ff)}
    end = 0
    for f in spec.fields:
        assert f.offset % FIELD_ALIGN == 0 and f.offset >= end
        out_d, in_d = want[f.name.split(".")[0]]
        if f.name.endswith("weight"):
            assert (f.dtype, f.shape, f.nbytes) == (
                "uint32",
                (out_d, in_d * bits // 32),
                out_d * in_d * bits // 8,
            )
        else:
            assert (f.dtype, f.shape, f.nbytes) == (
                dt,
                (out_d, in_d // gs),
                out_d * in_d // gs * item,
            )
        end = f.offset + f.nbytes
    assert spec.record_size - end < RECORD_ALIGN


def test_group_size_must_divide_dims() -> None:
    with pytest.raises(CheckpointError, match="group size 64"):
        record_layout(64, 32, 4, 64, "bfloat16")


def _random_fields(spec, rng):  # type: ignore[no-untyped-def]
    out = {}
    for f in spec.fields:
        dt = np.uint32 if f.dtype == "uint32" else np.uint16
        out[f.name] = rng.integers(0, np.iinfo(dt).max, size=f.shape, dtype=dt)
    return out


def test_pack_unpack_round_trip_and_zero_padding() -> None:
    spec = record_layout(128, 64, 4, 32, "bfloat16")
    arrays = _random_fields(spec, np.random.default_rng(0))
    record = pack_record(spec, arrays)
    assert record.dtype == np.uint8 and record.nbytes == spec.record_size
    back = unpack_record(spec, record.tobytes())
    for name, arr in arrays.items():
        assert np.array_equal(back[name], arr)
    covered = np.zeros(spec.record_size, bool)
    for f in spec.fields:
        covered[f.offset : f.offset + f.nbytes] = True
    assert not record[~covered].any()


def test_field_views_write_through_into_the_buffer() -> None:
    spec = record_layout(64, 32, 4, 32, "float16")
    buf = bytearray(spec.record_size)
    views = field_views(spec, buf)
    views["down_proj.scales"][...] = np.float16(1.5)
    f = next(f for f in spec.fields if f.name == "down_proj.scales")
    assert np.all(np.frombuffer(buf, np.float16, f.nbytes // 2, f.offset) == 1.5)
    with pytest.raises(CheckpointError, match="record buffer"):
        field_views(spec, bytearray(spec.record_size - 1))


def test_pack_rejects_wrong_shape() -> None:
    spec = record_layout(64, 32, 4, 32, "bfloat16")
    arrays = _random_fields(spec, np.random.default_rng(1))
    arrays["up_proj.weight"] = arrays["up_proj.weight"][:, :-1]
    with pytest.raises(CheckpointError, match="up_proj.weight"):
        pack_record(spec, arrays)


def test_manifest_round_trip_and_offset_rule(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = record_layout(64, 32, 4, 32, "bfloat16")
    m = Manifest(
        1,
        "qwen3_moe",
        {"model_type": "qwen3_moe"},
        {"bits": 4, "group_size": 32, "mode": "affine"},
        (1, 3),
        4,
        spec.record_size,
        0,
        spec.fields,
        tuple(range(8)),
        {"codec": "zstd", "level": 3, "file": "experts.zst", "index": "experts.zst.idx"},
    )
    m.save(tmp_path)
    back = Manifest.load(tmp_path)
    assert back == m
    assert back.record_offset(3, 2) == (1 * 4 + 2) * spec.record_size
    assert back.record_crc(3, 2) == 6
    with pytest.raises(CheckpointError, match="layer 2"):
        back.record_offset(2, 0)
