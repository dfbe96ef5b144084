"""The throttle tier's device arithmetic, on a fake clock, on both paths (the loop's
`read_into`, the threads' `read_blocking`), and its presets, options and errors."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tiers_helpers import FakeClock, all_keys, eio, plain_read, tiny_store

from edge0.errors import ConfigError, TierReadError
from edge0.storage.spec import open_tiers
from edge0.storage.tier import ExpertKey, ReadInfo, blocking_read
from tiers.pread import PreadTier
from tiers.throttle import PRESETS, ThrottleTier, sleep_until

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
        return self._fill(key, dest, t)

    def _fill(self, key: ExpertKey, dest: memoryview, t: float) -> ReadInfo:
        memoryview(dest)[:] = bytes([key.expert]) * SIZE
        return ReadInfo(self.name, SIZE, t, self.clock(), disk_bytes=self.disk_bytes)

    async def aclose(self) -> None:
        pass


class BlockingMemTier(MemTier):
    """MemTier that also reads on any thread (its delay advances the fake clock)."""

    blocking = True

    def read_blocking(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        t = self.clock()
        self.clock.now += self.delay
        return self._fill(key, dest, t)


def _advance(clock: FakeClock) -> Any:
    def sleep(seconds: float) -> None:
        clock.now += seconds

    return sleep


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


# --- the blocking path ------------------------------------------------------------
def _one_after_another(path: str, mem: dict[str, Any]) -> list[ReadInfo]:
    """Three reads, each after the last, through the loop's path or the threads' path."""
    clock = FakeClock()
    inner = (MemTier if path == "loop" else BlockingMemTier)(clock, **mem)
    tier = ThrottleTier(
        inner, bw=BW, lat=LAT, qd=1, clock=clock, sleep=clock.sleep, sleep_blocking=_advance(clock)
    )
    assert tier.blocking == (path == "thread")
    bufs = [bytearray(SIZE) for _ in range(3)]

    async def seq() -> list[ReadInfo]:
        return [
            (await clock.run(tier.read_into(ExpertKey(1, i), memoryview(b))))[0]
            for i, b in enumerate(bufs)
        ]

    if path == "loop":
        infos = asyncio.run(seq())
    else:
        infos = [tier.read_blocking(ExpertKey(1, i), memoryview(b)) for i, b in enumerate(bufs)]
    assert all(b == bytes([i]) * SIZE for i, b in enumerate(bufs))
    return infos


@pytest.mark.parametrize(
    "mem", [{}, {"disk_bytes": SIZE // 4}, {"delay": 4 * XFER}, {"delay": LAT / 2}]
)
def test_both_paths_apply_one_device_model(mem: dict[str, Any]) -> None:
    loop, thread = (_one_after_another(path, mem) for path in ("loop", "thread"))
    assert [i.finished for i in loop] == [i.finished for i in thread]
    assert all(i.tier == "throttle" and i.waited == 0.0 for i in loop + thread)
    if not mem:  # QD1, one after another: lat + bytes / bw each
        assert [i.finished for i in thread] == [k * (LAT + XFER) for k in (1, 2, 3)]


def test_sleep_until_sleeps_again_after_an_early_wake_up() -> None:
    clock = FakeClock()
    asked: list[float] = []

    def early(seconds: float) -> None:  # a sleep that wakes halfway
        asked.append(seconds)
        clock.now += seconds / 2 if len(asked) < 3 else seconds

    sleep_until(1.0, clock, early)
    assert clock.now == 1.0 and asked == [1.0, 0.5, 0.25]


def test_a_throttle_over_a_disk_tier_reads_on_any_thread(tmp_path: Path) -> None:
    m = tiny_store(tmp_path)
    for spec in ("throttle:nvme4>pread", "ram:32KiB>throttle:bw=1GB/s,lat=50us,qd=2>pread"):
        read = blocking_read(open_tiers(spec, tmp_path, m))
        assert read is not None, spec
        for key in all_keys(m):
            buf = bytearray(m.record_size)
            read(key, memoryview(buf))
            assert bytes(buf) == plain_read(tmp_path, m, key), (spec, key)
    assert blocking_read(ThrottleTier(MemTier(FakeClock()), bw=BW)) is None


def test_threads_share_the_bandwidth_and_at_most_qd_are_in_service(tmp_path: Path) -> None:
    """Real clock: lower bounds only (a loaded machine makes reads slower, never faster)."""
    m = tiny_store(tmp_path)
    bw, lat, qd = 16e6, 1e-3, 2
    tier = open_tiers(f"throttle:bw={bw:g}B/s,lat=1ms,qd={qd}>pread", tmp_path, m)
    assert isinstance(tier, ThrottleTier)
    inner_read = tier.inner.read_blocking  # type: ignore[attr-defined]
    in_service, most, mu = [0], [0], threading.Lock()

    def counted(key: ExpertKey, dest: memoryview) -> ReadInfo:
        with mu:
            in_service[0] += 1
            most[0] = max(most[0], in_service[0])
        time.sleep(2e-3)
        with mu:
            in_service[0] -= 1
        return inner_read(key, dest)

    tier.inner.read_blocking = counted  # type: ignore[attr-defined]
    keys = all_keys(m)[:8]
    infos: list[ReadInfo] = []

    def reader(part: list[ExpertKey]) -> None:
        for key in part:
            infos.append(tier.read_blocking(key, memoryview(bytearray(m.record_size))))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=reader, args=(keys[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    xfer = m.record_size / bw
    finished = sorted(i.finished - t0 for i in infos)
    assert len(finished) == 8 and most[0] <= qd
    # one channel: the k-th read done needs k transfers after the first latency
    assert all(f >= lat + k * xfer for k, f in enumerate(finished, 1)), finished
    asyncio.run(tier.aclose())


def test_inner_errors_surface_unchanged_on_both_paths(tmp_path: Path) -> None:
    m = tiny_store(tmp_path)
    key = ExpertKey(m.moe_layers[1], 2)
    errors = []
    for spec in ("pread", "throttle:bw=1GB/s>pread", "ram:32KiB>throttle:nvme4>pread"):
        tier = open_tiers(spec, tmp_path, m)
        disk = tier
        while not isinstance(disk, PreadTier):
            disk = disk.inner  # type: ignore[attr-defined]

        def broken(offset: int, length: int, dest: memoryview) -> int:
            raise eio()

        disk._read_raw = broken  # type: ignore[method-assign]
        for path in ("thread", "loop"):
            with pytest.raises(TierReadError) as err:
                buf = memoryview(bytearray(m.record_size))
                if path == "thread":
                    tier.read_blocking(key, buf)  # type: ignore[attr-defined]
                else:
                    asyncio.run(tier.read_into(key, buf))
            assert (err.value.layer, err.value.expert) == (key.layer, key.expert)
            errors.append(str(err.value))
        asyncio.run(tier.aclose())
    assert len(set(errors)) == 1 and f"layer {key.layer}" in errors[0], errors
