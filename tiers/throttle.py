"""`throttle`: wraps any tier and makes it behave like a slower device (bandwidth, latency, QD)
(docs/tiers.md, "throttle": the device model, the blocking and the loop paths).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import attrs

from edge0.errors import ConfigError
from edge0.storage.spec import choice, parse_duration, parse_int, parse_rate
from edge0.storage.tier import ExpertKey, ReadInfo, Tier
from tiers._disk import flat_bytes, run_in_pool


@attrs.frozen
class Device:
    bandwidth: float  # bytes/s, sequential read
    latency: float  # s, per read request before data flows
    queue_depth: int  # requests the device works on at once


# Figures are sequential-read bandwidth and a per-request latency from QD1 random
# 4 KiB read rates (latency = 1 / IOPS). Sources, as stated per line; the vendor
# figures were taken from the data sheets as remembered and are worth re-checking
# against the current sheet before quoting them.
PRESETS: dict[str, Device] = {
    # Apple M2 MacBook Air, 512 GB: ~2.9 GB/s sequential read in Blackmagic Disk
    # Speed Test runs reported by reviews (2022); Apple publishes no SSD figures.
    # The 256 GB model reads about half as fast. Latency: not published; 100 us
    # assumed (typical of Apple's NVMe controllers at QD1 in reviews).
    "m2": Device(2.9e9, 100e-6, 32),
    # PCIe 4.0 NVMe, Samsung 980 PRO 1 TB data sheet: 7,000 MB/s sequential read,
    # 22,000 IOPS random 4 KB read at QD1 (-> 45 us).
    "nvme4": Device(7.0e9, 45e-6, 32),
    # SATA SSD, Samsung 870 EVO data sheet: 560 MB/s sequential read, 13,000 IOPS
    # random 4 KB read at QD1 (-> 77 us); NCQ queue depth 32.
    "sata": Device(560e6, 77e-6, 32),
    # USB 3 disk: a USB 3.2 Gen 1 bus (5 Gbit/s, 8b/10b coding: 500 MB/s raw);
    # reviews of SATA SSDs in UASP enclosures measure ~400-450 MB/s. The bridge
    # adds per-command latency; 200 us and 4 commands in flight (UAS) assumed.
    "usb3": Device(420e6, 200e-6, 4),
    # 7,200 rpm hard disk, Seagate BarraCuda 2 TB data sheet: 220 MB/s maximum
    # sustained rate, 4.16 ms average rotational latency; plus ~8.5 ms average
    # seek, the usual desktop-drive figure (Seagate does not publish it) -> 12.7 ms.
    "hdd": Device(220e6, 12.7e-3, 1),
}


async def precise_sleep(delay: float) -> None:
    """Sleep `delay` seconds to ~0.1 ms.

    asyncio timers wake on whole milliseconds (epoll takes a timeout in ms), too
    coarse for an NVMe read of ~0.3 ms: the last stretch is slept in a thread.
    """
    end = time.perf_counter() + delay
    if delay > 0.002:
        await asyncio.sleep(delay - 0.0015)
    rest = end - time.perf_counter()
    if rest > 0:
        await asyncio.to_thread(time.sleep, rest)


def sleep_until(
    end: float,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Sleep on this thread until `clock()` reaches `end` (kernel timers: ~0.1 ms, no spinning)."""
    while (rest := end - clock()) > 0:
        sleep(rest)


class ThrottleTier:
    """Delays each read of the inner tier to the time the emulated device would need.

    Model: at most `qd` reads are in service at once (a semaphore). A read that
    enters service at t waits `lat`, then its bytes (the inner tier's on-disk
    bytes: compressed for zstd) move over one shared channel of bandwidth `bw`,
    in the order the reads reach it: transfer starts at max(t + lat, channel
    free) and takes bytes / bw. So QD hides latency, never adds bandwidth, and
    at QD1 a read takes exactly lat + bytes / bw. A read never finishes before
    the inner tier delivered it. `clock`, `sleep` (the loop path's) and
    `sleep_blocking` (the threads') are injectable for tests.
    """

    name: ClassVar[str] = "throttle"
    WRAPS: ClassVar[bool] = True
    POSITIONAL: ClassVar[str | None] = "preset"
    OPTIONS: ClassVar[dict[str, Callable[[str], Any]]] = {
        "preset": choice(*PRESETS),
        "bw": parse_rate,
        "lat": parse_duration,
        "qd": parse_int,
    }

    def __init__(
        self,
        inner: Tier,
        *,
        preset: str | None = None,
        bw: float | None = None,
        lat: float | None = None,
        qd: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[None]] = precise_sleep,
        sleep_blocking: Callable[[float], None] = time.sleep,
    ) -> None:
        if preset is not None and preset not in PRESETS:
            raise ConfigError(f"unknown throttle preset {preset!r}; presets: {', '.join(PRESETS)}")
        base = PRESETS[preset] if preset else None
        if bw is None and base is None:
            raise ConfigError(
                "throttle needs a bandwidth: bw=400MB/s, or a preset like preset=sata"
            )
        self.inner = inner
        self.preset = preset
        self.bandwidth = bw if bw is not None else base.bandwidth  # type: ignore[union-attr]
        self.latency = lat if lat is not None else (base.latency if base else 0.0)
        self.queue_depth = qd if qd is not None else (base.queue_depth if base else 1)
        self._clock = clock
        self._sleep = sleep
        self._sleep_blocking = sleep_blocking
        self._slots: asyncio.Semaphore | None = None  # the loop path's reads in service
        self._thread_slots = threading.BoundedSemaphore(self.queue_depth)  # the threads'
        self._pool: ThreadPoolExecutor | None = None  # read_into's threads (a blocking stack)
        self._mu = threading.Lock()
        self._channel_free = float("-inf")  # when the shared channel finishes its last transfer

    @property
    def blocking(self) -> bool:
        """Whether `read_blocking` works (the inner tier reads on any thread too)."""
        return bool(getattr(self.inner, "blocking", False))

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        started = self._clock()
        if self.blocking:  # the whole read, wait included, in one of our threads
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.queue_depth, "edge0-throttle")
            return await run_in_pool(self._pool, self._read_blocking, key, dest, started)
        if self._slots is None:  # created on first use, inside the running loop
            self._slots = asyncio.Semaphore(self.queue_depth)
        async with self._slots:
            entered = self._clock()
            info = await self.inner.read_into(key, dest)
            wait = self._transfer_done(entered, info, dest) - self._clock()
            if wait > 0:
                await self._sleep(wait)
            return self._done(info, started, entered)

    def read_blocking(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        """The read on the calling thread (only when `blocking`), the same device model."""
        return self._read_blocking(key, dest, self._clock())

    def _read_blocking(self, key: ExpertKey, dest: memoryview, started: float) -> ReadInfo:
        with self._thread_slots:
            entered = self._clock()
            info = self.inner.read_blocking(key, dest)  # type: ignore[attr-defined]
            done = self._transfer_done(entered, info, dest)
            sleep_until(done, self._clock, self._sleep_blocking)
            return self._done(info, started, entered)

    def _transfer_done(self, entered: float, info: ReadInfo, dest: memoryview) -> float:
        """When the device has served a read that entered service at `entered` and that the
        inner tier answered with `info`: latency, then its bytes over the shared channel."""
        nbytes = info.disk_bytes if info.disk_bytes is not None else flat_bytes(dest).nbytes
        with self._mu:  # reads of both paths and every thread share the channel
            done = max(entered + self.latency, self._channel_free) + nbytes / self.bandwidth
            self._channel_free = done
        return done

    def _done(self, info: ReadInfo, started: float, entered: float) -> ReadInfo:
        return attrs.evolve(
            info, tier=self.name, started=started, finished=self._clock(), waited=entered - started
        )

    async def aclose(self) -> None:
        if self._pool is not None:  # run_in_pool waited for every read it started
            self._pool.shutdown(wait=False)
        await self.inner.aclose()
