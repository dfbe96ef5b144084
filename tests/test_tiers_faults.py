"""Disk-tier faults: EIO, short reads, CRC mismatches (retry once, then TierReadError),
truncated and corrupted files, cancellation, madvise failure and the O_DIRECT fallback."""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs
from tiers_helpers import all_keys, eio, plain_read, tiny_store

from edge0.errors import CheckpointError, TierReadError
from edge0.layout.manifest import EXPERTS_FILE, ZSTD_FILE, Manifest
from edge0.storage.spec import open_tiers
from edge0.storage.tier import ExpertKey
from tiers._disk import DiskTier

DISK_TIERS = ["pread", "mmap", "direct", "zstd"]


@pytest.fixture()
def store(tmp_path: Path) -> tuple[Path, Manifest]:
    return tmp_path, tiny_store(tmp_path)


def _open(spec: str, store: tuple[Path, Manifest]) -> DiskTier:
    tier = open_tiers(spec, *store)
    assert isinstance(tier, DiskTier)
    return tier


def _read(tier: Any, m: Manifest, key: ExpertKey) -> tuple[bytes, Any]:
    async def main() -> tuple[bytes, Any]:
        buf = bytearray(m.record_size)
        info = await tier.read_into(key, memoryview(buf))
        return bytes(buf), info

    return asyncio.run(main())


def _inject(tier: DiskTier, fault: str, times: int) -> None:
    """Make the next `times` raw reads fail with `fault` (eio | short | corrupt)."""
    real = tier._read_raw
    left = [times]

    def faulty(offset: int, length: int, dest: memoryview) -> int:
        if left[0] <= 0:
            return real(offset, length, dest)
        left[0] -= 1
        if fault == "eio":
            raise eio()
        n = real(offset, length, dest)
        if fault == "short":
            return n - 1
        dest[100] ^= 0xFF  # corrupt one byte
        return n

    tier._read_raw = faulty  # type: ignore[method-assign]


@pytest.mark.parametrize("spec", DISK_TIERS)
@pytest.mark.parametrize("fault", ["eio", "short", "corrupt"])
def test_one_fault_is_retried(store, spec: str, fault: str) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    tier = _open(spec, store)
    key = all_keys(m)[6]
    _inject(tier, fault, 1)
    data, info = _read(tier, m, key)
    assert data == plain_read(d, m, key) and info.attempts == 2


@pytest.mark.parametrize("spec", DISK_TIERS)
@pytest.mark.parametrize(
    ("fault", "reason"),
    [("eio", "Input/output error"), ("short", "short read"), ("corrupt", "CRC32 mismatch")],
)
def test_two_faults_raise_naming_the_record(store, spec: str, fault: str, reason: str) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    tier = _open(spec, store)
    key = all_keys(m)[6]
    _inject(tier, fault, 2)
    with pytest.raises(TierReadError, match=reason) as err:
        _read(tier, m, key)
    e = err.value
    assert (e.layer, e.expert) == (key.layer, key.expert)
    assert e.file is not None and Path(e.file).parent == d
    assert e.offset == tier._locate(key)[0]
    assert f"layer {key.layer}, expert {key.expert}, offset {e.offset}" in str(e)


@pytest.mark.parametrize("spec", DISK_TIERS)
def test_truncated_file(store, spec: str) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    path = d / (ZSTD_FILE if spec == "zstd" else EXPERTS_FILE)
    size = path.stat().st_size
    tier = _open(spec, store)
    os.truncate(path, size - 5000)  # after open: the last record is cut short
    last, first = all_keys(m)[-1], all_keys(m)[0]
    assert _read(tier, m, first)[0] == plain_read(d, m, first)
    with pytest.raises(TierReadError, match="short read"):
        _read(tier, m, last)
    with pytest.raises(CheckpointError, match="truncated"):
        open_tiers(spec, d, m)  # checked up front on open


@pytest.mark.parametrize("spec", DISK_TIERS)
def test_corrupted_file(store, spec: str) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    key = all_keys(m)[5]
    if spec == "zstd":
        index = np.fromfile(d / "experts.zst.idx", "<u8").reshape(-1, 2)
        path, pos = d / ZSTD_FILE, int(index[m.record_index(key.layer, key.expert)][0]) + 200
    else:
        path, pos = d / EXPERTS_FILE, m.record_offset(key.layer, key.expert) + 200
    raw = bytearray(path.read_bytes())
    raw[pos] ^= 0x5A
    path.write_bytes(raw)
    with pytest.raises(TierReadError, match="CRC32 mismatch|corrupt zstd frame"):
        _read(_open(spec, store), m, key)
    other = all_keys(m)[0]
    assert _read(_open(spec, store), m, other)[0] == plain_read(d, m, other)
    if spec != "zstd":  # verify=false hands over the bytes as they are on disk
        data, _ = _read(_open(spec + ":verify=false", store), m, key)
        assert data == plain_read(d, m, key)
        assert zlib.crc32(data) != m.record_crc(key.layer, key.expert)


def test_verify_once_checks_only_the_first_read(store) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    key = all_keys(m)[3]
    tier = _open("pread:verify=once", store)
    _inject(tier, "corrupt", 1)
    data, info = _read(tier, m, key)  # first read: checked, retried
    assert info.attempts == 2 and data == plain_read(d, m, key)
    _inject(tier, "corrupt", 1)
    data, info = _read(tier, m, key)  # later reads of that record are trusted
    assert info.attempts == 1 and data != plain_read(d, m, key)
    other = all_keys(m)[4]
    _inject(tier, "corrupt", 2)
    with pytest.raises(TierReadError, match="CRC32"):
        _read(tier, m, other)


def test_cancel_waits_for_the_worker_thread(store) -> None:  # type: ignore[no-untyped-def]
    """A cancelled read returns only after the thread stopped writing into the buffer."""
    d, m = store
    tier = _open("pread", store)
    go, wrote = threading.Event(), threading.Event()
    real = tier._read_raw

    def slow(offset: int, length: int, dest: memoryview) -> int:
        go.wait(5)
        n = real(offset, length, dest)
        wrote.set()
        return n

    tier._read_raw = slow  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.create_task(tier.read_into(all_keys(m)[1], bytearray(m.record_size)))
        await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for the thread
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert wrote.is_set()
        await tier.aclose()

    asyncio.run(main())


def test_madvise_failure_is_a_warning(store, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import tiers.mmap

    def refuse(*_: object) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(tiers.mmap, "_madvise", refuse)
    d, m = store
    tier = _open("mmap", store)
    with capture_logs() as logs:
        for key in all_keys(m)[:3]:
            assert _read(tier, m, key)[0] == plain_read(d, m, key)
    assert [e["event"] for e in logs] == ["mmap.madvise_failed"]  # once, as a warning
    assert logs[0]["log_level"] == "warning"


def test_direct_reads_aligned_and_unaligned_buffers(store) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    tier = _open("direct", store)
    if tier.mode != "o_direct":  # type: ignore[attr-defined]
        pytest.skip(f"this filesystem gives mode {tier.mode}")  # type: ignore[attr-defined]
    key = all_keys(m)[9]
    aligned = mmap.mmap(-1, m.record_size)
    bounced = []
    real = tier._bounce  # type: ignore[attr-defined]
    tier._bounce = lambda n: bounced.append(n) or real(n)  # type: ignore[attr-defined]
    odd = np.zeros(m.record_size + 4096, np.uint8)[24 : 24 + m.record_size]

    async def main() -> None:
        view = memoryview(aligned)
        await tier.read_into(key, view)
        assert bounced == []  # straight into the aligned buffer
        await tier.read_into(key, odd.data)
        assert bounced == [m.record_size]
        view.release()
        await tier.aclose()

    asyncio.run(main())
    assert bytes(aligned) == odd.tobytes() == plain_read(d, m, key)


def test_direct_falls_back_when_the_filesystem_refuses(
    store, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Like tmpfs before Linux 6.6: open(O_DIRECT) fails with EINVAL."""
    import tiers.direct

    if tiers.direct.O_DIRECT is None:
        pytest.skip("no O_DIRECT on this OS")
    real_open = os.open

    def refusing_open(path: Any, flags: int, *args: Any) -> int:
        if flags & tiers.direct.O_DIRECT:  # type: ignore[operator]
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing_open)
    d, m = store
    with capture_logs() as logs:
        tier = _open("direct", store)
    assert tier.mode == "buffered"  # type: ignore[attr-defined]
    assert logs[0]["event"] == "direct.fallback" and "refuses O_DIRECT" in logs[0]["reason"]
    key = all_keys(m)[4]
    assert _read(tier, m, key)[0] == plain_read(d, m, key)


def test_direct_falls_back_when_a_read_is_refused(store, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import tiers.direct

    d, m = store
    tier = _open("direct", store)
    if tier.mode != "o_direct":  # type: ignore[attr-defined]
        pytest.skip(f"this filesystem gives mode {tier.mode}")  # type: ignore[attr-defined]
    real = tiers.direct.pread_full

    def refuse_aligned(fd: int, dest: memoryview, offset: int, align: int = 1) -> int:
        if align > 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, dest, offset)

    monkeypatch.setattr(tiers.direct, "pread_full", refuse_aligned)
    key = all_keys(m)[8]
    with capture_logs() as logs:
        data, info = _read(tier, m, key)
    assert data == plain_read(d, m, key) and info.attempts == 1
    assert tier.mode == "buffered"  # type: ignore[attr-defined]
    assert [e["event"] for e in logs] == ["direct.fallback"]


def test_direct_without_os_support_warns(store, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import tiers.direct

    monkeypatch.setattr(tiers.direct, "O_DIRECT", None)
    monkeypatch.setattr(tiers.direct, "F_NOCACHE", None)
    d, m = store
    with capture_logs() as logs:
        tier = _open("direct", store)
    assert tier.mode == "buffered"  # type: ignore[attr-defined]
    assert "neither O_DIRECT nor F_NOCACHE" in logs[0]["reason"]
    key = all_keys(m)[2]
    assert _read(tier, m, key)[0] == plain_read(d, m, key)


def test_zstd_needs_its_side_files(tmp_path: Path) -> None:
    from edge0.synth.store import write_store

    m = write_store(tmp_path, zstd_level=None)
    with pytest.raises(CheckpointError, match="--compress zstd"):
        open_tiers("zstd", tmp_path, m)
    m = write_store(tmp_path / "z")
    (tmp_path / "z" / "experts.zst.idx").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError, match="holds 1 entries, the manifest has 12"):
        open_tiers("zstd", tmp_path / "z", m)


def test_retries_option(store) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    key = all_keys(m)[1]
    tier = _open("pread:retries=0", store)
    _inject(tier, "eio", 1)
    with pytest.raises(TierReadError, match="after 1 attempts"):
        _read(tier, m, key)
    tier = _open("pread:retries=3", store)
    _inject(tier, "corrupt", 3)
    data, info = _read(tier, m, key)
    assert info.attempts == 4 and data == plain_read(d, m, key)


def test_direct_uses_f_nocache_where_there_is_no_o_direct(
    store, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The macOS path, driven through a stand-in fcntl module."""
    import types

    import tiers.direct

    calls: list[tuple[int, int, int]] = []
    fake = types.SimpleNamespace(fcntl=lambda fd, cmd, arg: calls.append((fd, cmd, arg)))
    monkeypatch.setattr(tiers.direct, "O_DIRECT", None)
    monkeypatch.setattr(tiers.direct, "F_NOCACHE", 48)  # F_NOCACHE's value on macOS
    monkeypatch.setattr(tiers.direct, "fcntl", fake)
    d, m = store
    tier = _open("direct", store)
    assert tier.mode == "f_nocache"  # type: ignore[attr-defined]
    assert calls == [(tier._fd, 48, 1)]  # type: ignore[attr-defined]
    key = all_keys(m)[10]
    assert _read(tier, m, key)[0] == plain_read(d, m, key)
