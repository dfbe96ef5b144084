"""Every tier stack returns byte-identical records to a plain read, for every record."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from tiers_helpers import all_keys, plain_read, tiny_store

from edge0.storage.spec import open_tiers
from edge0.storage.tier import ExpertKey, Tier

SPECS = [
    "pread",
    "pread:verify=false,workers=1",
    "mmap",
    "mmap:verify=once",
    "direct",
    "zstd",
    "ram:64KiB>pread",
    "ram:1GiB,policy=lfuda>mmap",
    "ram:48KiB,policy=lfuda>throttle:bw=1GB/s,lat=50us,qd=2>direct",
    "throttle:nvme4>zstd:workers=2",
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("store")
    return d, tiny_store(d)


async def _read_all(tier: Tier, keys: list[ExpertKey], size: int) -> list[bytes]:
    bufs = [np.zeros(size, np.uint8) for _ in keys]
    await asyncio.gather(*(tier.read_into(k, b.data) for k, b in zip(keys, bufs, strict=True)))
    return [b.tobytes() for b in bufs]


@pytest.mark.parametrize("spec", SPECS)
def test_every_record_identical_under_concurrency(store, spec: str) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    keys = all_keys(m) * 3  # each key three times, all in flight together
    want = [plain_read(d, m, k) for k in keys]

    async def main() -> None:
        tier = open_tiers(spec, d, m)
        try:
            for _ in range(2):  # cold then warm (cache hits for ram stacks)
                assert await _read_all(tier, keys, m.record_size) == want
        finally:
            await tier.aclose()

    asyncio.run(main())


def test_dest_buffer_kinds(store) -> None:  # type: ignore[no-untyped-def]
    d, m = store
    key = all_keys(m)[5]
    want = plain_read(d, m, key)

    async def main() -> None:
        tier = open_tiers("pread", d, m)
        try:
            ba = bytearray(m.record_size)
            await tier.read_into(key, memoryview(ba))
            assert bytes(ba) == want
            u32 = np.zeros(m.record_size // 4, np.uint32)  # a typed slot view
            await tier.read_into(key, u32.data)
            assert u32.tobytes() == want
            raw = np.zeros(m.record_size + 4096, np.uint8)
            odd = raw[24 : 24 + m.record_size]  # like an MLX CPU buffer: address % 4096 == 24
            await tier.read_into(key, odd.data)
            assert odd.tobytes() == want
            with pytest.raises(ValueError, match="record is"):
                await tier.read_into(key, bytearray(m.record_size - 1))
            with pytest.raises(ValueError, match="writable"):
                await tier.read_into(key, memoryview(bytes(m.record_size)))
        finally:
            await tier.aclose()

    asyncio.run(main())


def test_object_composition_matches_spec(store) -> None:  # type: ignore[no-untyped-def]
    from tiers.pread import PreadTier
    from tiers.ram import RamTier

    d, m = store
    key = all_keys(m)[0]

    async def main() -> None:
        tier = RamTier(PreadTier(Path(d), m, workers=2), budget=1 << 20, policy="lfuda")
        assert open_tiers(tier, d, m) is tier
        buf = bytearray(m.record_size)
        info = await tier.read_into(key, memoryview(buf))
        assert (info.tier, info.hit, info.nbytes) == ("pread", False, m.record_size)
        info = await tier.read_into(key, memoryview(buf))
        assert (info.tier, info.hit) == ("ram", True)
        assert bytes(buf) == plain_read(d, m, key)
        await tier.aclose()

    asyncio.run(main())


def test_every_tier_reads_a_converted_checkpoint(qwen3_moe_path: Path, tmp_path: Path) -> None:
    """The tiers read what `edge0 convert --compress zstd` writes, record for record."""
    from edge0.layout.convert import ConvertOptions, convert

    out = tmp_path / "layout"
    m = convert(qwen3_moe_path, out, ConvertOptions(group_size=32, compress="zstd"))
    keys = all_keys(m)
    want = [plain_read(out, m, k) for k in keys]

    async def main() -> None:
        for spec in ("pread", "mmap", "direct", "zstd", "ram:1MiB>throttle:nvme4>zstd"):
            tier = open_tiers(spec, out, m)
            try:
                assert await _read_all(tier, keys, m.record_size) == want, spec
            finally:
                await tier.aclose()

    asyncio.run(main())
