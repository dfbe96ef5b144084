"""`edge0 bench tiers`: MB/s and latency of random expert reads per tier stack, cold and warm."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from edge0.layout import pagecache
from edge0.layout.manifest import EXPERTS_FILE, ZSTD_FILE, Manifest
from edge0.log import get_logger
from edge0.storage.spec import open_tiers
from edge0.storage.tier import ExpertKey, Tier

log = get_logger("edge0.bench")

DEFAULT_SPECS = (
    "pread",
    "mmap",
    "direct",
    "zstd",
    "pread:verify=false",
    "ram:1GiB>direct",
    # a RAM stage inside the throttle: warm passes then measure the emulation alone
    "throttle:m2>ram:1GiB>pread",
    "throttle:nvme4>ram:1GiB>pread",
    "throttle:sata>ram:1GiB>pread",
    "throttle:usb3>ram:1GiB>pread",
    "throttle:hdd>ram:1GiB>pread",
)
MLX_OFFSET = 24  # MLX CPU buffers sit at address % 4096 == 24 (measured)


@attrs.frozen
class BenchRow:
    spec: str
    qd: int
    phase: str  # "cold": page cache of the store dropped, fresh tier stack; "warm": same keys again
    reads: int
    mb_s: float  # decimal MB of records delivered per second of wall time
    p50_ms: float
    p99_ms: float
    hit_rate: float  # reads served by a RAM tier without touching the inner tier
    set_mb_s: float | None  # a throttle's configured bandwidth, for comparison
    model_mb_s: float | None  # what the throttle's device model allows at this QD and record size


def drop_page_cache(model_dir: Path) -> bool:
    """Ask the kernel to drop the store's cached pages (POSIX_FADV_DONTNEED); False if it can't."""
    if not pagecache.can_drop():
        return False
    for name in (EXPERTS_FILE, ZSTD_FILE):
        pagecache.drop(Path(model_dir) / name)
    return True


def sample_keys(manifest: Manifest, n: int, seed: int) -> list[ExpertKey]:
    """n distinct random records (all of them, shuffled, if n >= the record count)."""
    keys = [ExpertKey(layer, e) for layer in manifest.moe_layers for e in range(manifest.n_experts)]
    return random.Random(seed).sample(keys, min(n, len(keys)))


def slot_buffers(n: int, size: int, aligned: bool) -> tuple[list[np.ndarray], list[memoryview]]:
    """n record buffers, page-aligned or at MLX's alignment (address % 4096 == 24)."""
    owners, views = [], []
    for _ in range(n):
        raw = np.empty(size + 8192, np.uint8)
        base = (-raw.ctypes.data) % 4096 + (0 if aligned else MLX_OFFSET)
        owners.append(raw)
        views.append(raw[base : base + size].data)
    return owners, views


def device_model_mb_s(throttle: Any, nbytes: int, qd: int) -> float:
    """Steady-state MB/s of the throttle's model: min(bw, QD * bytes / (lat + bytes / bw))."""
    q = min(qd, throttle.queue_depth)
    cycle = throttle.latency + nbytes / throttle.bandwidth
    return float(min(throttle.bandwidth, q * nbytes / cycle) / 1e6)


def _stack(tier: Any) -> Iterator[Any]:
    while tier is not None:
        yield tier
        tier = getattr(tier, "inner", None)


async def _one_pass(tier: Tier, keys: Sequence[ExpertKey], bufs: list[memoryview]) -> tuple:
    """Read `keys` with len(bufs) reads in flight; returns (latencies s, wall s, hits)."""
    todo = iter(keys)
    lat: list[float] = []
    hits = 0

    async def worker(buf: memoryview) -> None:
        nonlocal hits
        for key in todo:
            t = time.perf_counter()
            info = await tier.read_into(key, buf)
            lat.append(time.perf_counter() - t)
            hits += info.hit

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(b) for b in bufs))
    return lat, time.perf_counter() - t0, hits


async def bench_spec(
    spec: str,
    model_dir: Path,
    manifest: Manifest,
    keys: Sequence[ExpertKey],
    qds: Sequence[int] = (1, 2, 3, 4),
    aligned: bool = False,
) -> list[BenchRow]:
    rows = []
    for qd in qds:
        drop_page_cache(model_dir)
        tier = open_tiers(spec, model_dir, manifest)  # fresh: an empty RAM cache
        throttle = next((t for t in _stack(tier) if hasattr(t, "bandwidth")), None)
        set_mb_s = model_mb_s = None
        if throttle is not None:
            set_mb_s = throttle.bandwidth / 1e6
            model_mb_s = device_model_mb_s(throttle, manifest.record_size, qd)
        _owners, bufs = slot_buffers(qd, manifest.record_size, aligned)
        try:
            for phase in ("cold", "warm"):
                lat, wall, hits = await _one_pass(tier, keys, bufs)
                ms = np.asarray(lat) * 1e3
                rows.append(
                    BenchRow(
                        spec,
                        qd,
                        phase,
                        len(keys),
                        len(keys) * manifest.record_size / wall / 1e6,
                        float(np.percentile(ms, 50)),
                        float(np.percentile(ms, 99)),
                        hits / len(keys),
                        set_mb_s,
                        model_mb_s,
                    )
                )
        finally:
            await tier.aclose()
    return rows


def run_bench(
    model_dir: Path,
    specs: Sequence[str],
    *,
    reads: int = 64,
    qds: Sequence[int] = (1, 2, 3, 4),
    seed: int = 0,
    aligned: bool = False,
) -> list[BenchRow]:
    """Benchmark each spec in turn on the same random records (see `bench_spec`)."""
    manifest = Manifest.load(model_dir)
    keys = sample_keys(manifest, reads, seed)
    rows: list[BenchRow] = []
    for spec in specs:
        rows += asyncio.run(bench_spec(spec, model_dir, manifest, keys, qds, aligned))
    return rows


def format_table(rows: Sequence[BenchRow]) -> str:
    w = max([len("tiers"), *(len(r.spec) for r in rows)])
    head = f"{'tiers':<{w}} {'qd':>2} {'pass':<4} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
    head += f"{'hit%':>5} {'set MB/s':>8} {'model':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        set_bw = f"{r.set_mb_s:8.0f}" if r.set_mb_s is not None else f"{'':8}"
        set_bw += f" {r.model_mb_s:6.0f}" if r.model_mb_s is not None else ""
        lines.append(
            f"{r.spec:<{w}} {r.qd:>2} {r.phase:<4} {r.mb_s:8.0f} {r.p50_ms:8.2f} {r.p99_ms:8.2f} "
            f"{100 * r.hit_rate:5.0f} {set_bw}"
        )
    return "\n".join(lines)


# --- the aiofiles-versus-executor measurement behind the pread tier's design ---
def compare_readers(
    model_dir: Path, reads: int = 40, rounds: int = 7, seed: int = 0
) -> dict[str, float]:
    """Median over `rounds` (methods interleaved) of mean us per page-cache-hot record read:
    sync preadv, executor preadv into a preallocated buffer, aiofiles seek+read + copy."""
    import aiofiles

    manifest = Manifest.load(model_dir)
    path = Path(model_dir) / EXPERTS_FILE
    offsets = [
        manifest.record_offset(k.layer, k.expert) for k in sample_keys(manifest, reads, seed)
    ]
    size = manifest.record_size
    buf = memoryview(bytearray(size))
    fd = os.open(path, os.O_RDONLY)

    async def sync() -> None:
        for off in offsets:
            os.preadv(fd, [buf], off)

    async def executor() -> None:
        loop = asyncio.get_running_loop()
        for off in offsets:
            await loop.run_in_executor(pool, os.preadv, fd, [buf], off)

    async def aio() -> None:
        async with aiofiles.open(path, "rb") as f:
            for off in offsets:
                await f.seek(off)
                buf[:] = await f.read(size)  # into the slot, as the engine needs

    methods = {"sync preadv": sync, "executor preadv": executor, "aiofiles seek+read": aio}
    times: dict[str, list[float]] = {name: [] for name in methods}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(sync())  # make the page cache hot
        for _ in range(rounds):
            for name, fn in methods.items():
                t = time.perf_counter()
                asyncio.run(fn())
                times[name].append((time.perf_counter() - t) / len(offsets) * 1e6)
    os.close(fd)
    return {name: float(np.median(ts)) for name, ts in times.items()}
