"""The throttle tier's device arithmetic, on a fake clock, and its presets and options."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tiers_helpers import FakeClock, tiny_store

from edge0.errors import ConfigError
from edge0.storage.spec import open_tiers
from edge0.storage.tier import ExpertKey, ReadInfo
from tiers.throttle import PRESETS, ThrottleTier

SIZE = 16384
LAT = 2.0**-11  # binary fractions: the expected times are exact floats
XFER = 2.0**-10  # SIZE / BW
BW = SIZE / XFER


class MemTier:
    """An instant in-memory tier; optionally slow on the fake clock, or reporting disk bytes."""

    name = "mem"

    def __init__(self, clock: FakeClock, delay: float = 0.0, disk_bytes: int | None = None):
        self.clock, self.delay, self.disk_bytes = clock, delay, disk_bytes

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        t = self.clock()
        if self.delay:
            await self.clock.sleep(self.delay)
        memoryview(dest)[:] = bytes([key.expert]) * SIZE
        return ReadInfo(self.name, SIZE, t, self.clock(), disk_bytes=self.disk_bytes)

    async def aclose(self) -> None:
        pass


def _run(qd: int, n: int = 4, lat: float = LAT, **mem: object) -> list[ReadInfo]:
    clock = FakeClock()
    inner = MemTier(clock, **mem)  # type: ignore[arg-type]
    tier = ThrottleTier(inner, bw=BW, lat=lat, qd=qd, clock=clock, sleep=clock.sleep)

    async def main() -> list[ReadInfo]:
        bufs = [bytearray(SIZE) for _ in range(n)]
        reads = [tier.read_into(ExpertKey(1, i), memoryview(b)) for i, b in enumerate(bufs)]
        infos = await clock.run(*reads)
        assert all(b == bytes([i]) * SIZE for i, b in enumerate(bufs))
        return infos

    return asyncio.run(main())


def test_qd1_serialises_latency_plus_transfer() -> None:
    infos = _run(qd=1)
    assert [i.finished for i in infos] == [k * (LAT + XFER) for k in (1, 2, 3, 4)]
    assert [i.waited for i in infos] == [k * (LAT + XFER) for k in (0, 1, 2, 3)]
    assert all(i.started == 0.0 and i.tier == "throttle" for i in infos)


def test_qd2_hides_latency_not_bandwidth() -> None:
    infos = _run(qd=2)
    # r1: lat, xfer -> LAT+XFER; r2 queues on the channel -> LAT+2X;
    # r3 enters when r1 leaves, its latency overlaps r2's transfer -> LAT+3X; r4 -> LAT+4X
    assert [i.finished for i in infos] == [LAT + k * XFER for k in (1, 2, 3, 4)]


def test_no_latency_is_pure_bandwidth() -> None:
    infos = _run(qd=4, lat=0.0)
    assert [i.finished for i in infos] == [k * XFER for k in (1, 2, 3, 4)]


def test_disk_bytes_set_the_transfer_time() -> None:
    infos = _run(qd=1, n=2, disk_bytes=SIZE // 4)  # e.g. a compressed frame
    assert [i.finished for i in infos] == [k * (LAT + XFER / 4) for k in (1, 2)]


def test_slow_inner_tier_is_never_hidden() -> None:
    infos = _run(qd=1, n=2, delay=4 * XFER)
    # each read: inner takes 4X (> LAT + X); the device would be done earlier
    assert [i.finished for i in infos] == [4 * XFER, 8 * XFER]


def test_presets_and_overrides(tmp_path: Path) -> None:
    m = tiny_store(tmp_path)
    t = open_tiers("throttle:preset=sata>pread", tmp_path, m)
    assert isinstance(t, ThrottleTier)
    sata = PRESETS["sata"]
    assert (t.bandwidth, t.latency, t.queue_depth) == (sata.bandwidth, sata.latency, 32)
    t2 = open_tiers("throttle:usb3,lat=1ms,qd=2>pread", tmp_path, m)
    assert isinstance(t2, ThrottleTier)
    assert (t2.bandwidth, t2.latency, t2.queue_depth) == (420e6, 1e-3, 2)
    t3 = open_tiers("throttle:bw=400MB/s,lat=200us,qd=2>pread", tmp_path, m)
    assert isinstance(t3, ThrottleTier)
    assert (t3.bandwidth, t3.latency, t3.queue_depth) == (400e6, pytest.approx(200e-6), 2)
    for tier in (t, t2, t3):
        asyncio.run(tier.aclose())
    with pytest.raises(ConfigError, match="throttle needs a bandwidth"):
        open_tiers("throttle:lat=1ms>pread", tmp_path, m)
    with pytest.raises(ConfigError, match="'floppy' is not one of m2, nvme4, sata, usb3, hdd"):
        open_tiers("throttle:floppy>pread", tmp_path, m)


def test_real_clock_read_takes_at_least_the_device_time(tmp_path: Path) -> None:
    import time

    m = tiny_store(tmp_path)
    tier = open_tiers("throttle:bw=16MB/s,lat=2ms>pread", tmp_path, m)

    async def main() -> float:
        t = time.perf_counter()
        await tier.read_into(ExpertKey(1, 0), bytearray(m.record_size))
        await tier.aclose()
        return time.perf_counter() - t

    assert asyncio.run(main()) >= 2e-3 + m.record_size / 16e6
