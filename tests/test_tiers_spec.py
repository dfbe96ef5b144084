"""Spec strings: sizes, rates, durations, stage parsing, registry look-up and helpful errors."""

from __future__ import annotations

import asyncio
import os
from importlib import metadata
from pathlib import Path

import pytest
from tiers_helpers import all_keys, plain_read, tiny_store

from edge0.errors import ConfigError
from edge0.storage import spec as tierspec
from edge0.storage.spec import (
    open_tiers,
    parse_duration,
    parse_rate,
    parse_size,
    parse_spec,
    register_tier,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("1GiB", 1 << 30),
        ("512MiB", 512 << 20),
        ("400MB", 400_000_000),
        ("16k", 16_000),
        ("1.5kib", 1536),
        (" 2 gb ", 2_000_000_000),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "1XB", "-1MB", "1 2"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_parse_rate_and_duration() -> None:
    assert parse_rate("400MB/s") == 400e6
    assert parse_rate("1.5GiB/s") == 1.5 * (1 << 30)
    assert parse_rate("2000") == 2000.0
    assert parse_duration("200us") == pytest.approx(200e-6)
    assert parse_duration("1.5ms") == pytest.approx(1.5e-3)
    assert parse_duration("0.01") == pytest.approx(0.01)
    with pytest.raises(ValueError, match="bandwidth"):
        parse_rate("fast")
    with pytest.raises(ValueError, match="positive"):
        parse_rate("0MB/s")
    with pytest.raises(ValueError, match="duration"):
        parse_duration("3 weeks")


def test_parse_spec_stages() -> None:
    stages = parse_spec("ram:512MiB,policy=lfuda > throttle:preset=sata>pread")
    assert [s.name for s in stages] == ["ram", "throttle", "pread"]
    assert stages[0].positional == "512MiB"
    assert stages[0].options == (("policy", "lfuda"),)
    assert stages[1].positional is None and stages[1].options == (("preset", "sata"),)
    assert parse_spec("pread")[0].options == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty tier spec"),
        ("ram:1GiB>", "bad stage"),
        ("ram:1GiB,2GiB>pread", "needs a name"),
        ("ram:policy=lru,policy=lfuda>pread", "given twice"),
        ("ram:1GiB,budget=2GiB>pread", "given twice"),
        ("nosuch>pread", "unknown tier 'nosuch'; known tiers: direct, mmap, pread, ram"),
        ("ram:1GiB", "wraps another tier"),
        ("pread>pread", "must be the last stage"),
        ("ram:lots>pread", "option budget: 'lots' is not a size"),
        ("ram:1GiB,policy=fifo>pread", "'fifo' is not one of lru, lfuda"),
        ("ram:1GiB,colour=red>pread", "has no option 'colour'; options: budget, policy"),
        ("pread:fast", "takes no bare value"),
        ("pread:verify=maybe", "not a boolean"),
    ],
)
def test_spec_errors(tmp_path: Path, spec: str, message: str) -> None:
    m = tiny_store(tmp_path)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        open_tiers(spec, tmp_path, m)


def test_missing_file_is_named(tmp_path: Path) -> None:
    m = tiny_store(tmp_path)
    (tmp_path / "experts.bin").unlink()
    with pytest.raises(Exception, match="experts.bin not found"):
        open_tiers("pread", tmp_path, m)


class _Counting:
    """A minimal third-party wrapper tier for the registry tests."""

    name = "counting"
    WRAPS = True
    POSITIONAL = None
    OPTIONS = {"label": str}

    def __init__(self, inner, label: str = "x") -> None:  # type: ignore[no-untyped-def]
        self.inner, self.label, self.count = inner, label, 0

    async def read_into(self, key, dest):  # type: ignore[no-untyped-def]
        self.count += 1
        return await self.inner.read_into(key, dest)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_entry_point_plugin_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package's `edge0.tiers` entry point is looked up by name like the built-ins."""
    m = tiny_store(tmp_path)
    real = tierspec._entry_points()
    fake = metadata.EntryPoint(
        name="counting", value=f"{__name__}:_Counting", group=tierspec.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(tierspec, "_entry_points", lambda: {**real, "counting": fake})
    assert "counting" in tierspec.known_tiers()
    tier = open_tiers("counting:label=hello>pread", tmp_path, m)
    assert isinstance(tier, _Counting) and tier.label == "hello"
    key = all_keys(m)[3]

    async def main() -> None:
        buf = bytearray(m.record_size)
        await tier.read_into(key, memoryview(buf))
        await tier.aclose()
        assert bytes(buf) == plain_read(tmp_path, m, key)

    asyncio.run(main())
    assert tier.count == 1


def test_broken_plugin_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = metadata.EntryPoint(name="broken", value="no_such_module_xyz:Tier", group="g")
    monkeypatch.setattr(tierspec, "_entry_points", lambda: {"broken": fake})
    with pytest.raises(ConfigError, match="tier 'broken' .* failed to load"):
        tierspec.tier_class("broken")


def test_register_tier_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tierspec, "_registered", {})
    register_tier("counting2", _Counting)
    m = tiny_store(tmp_path)
    tier = open_tiers("counting2>ram:1MiB>pread", tmp_path, m)
    assert isinstance(tier, _Counting)
    asyncio.run(tier.aclose())


def test_example_custom_tier_through_an_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/custom_tier.py, registered as a package would register it, is found by name."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "examples"))
    real = tierspec._entry_points()
    ep = metadata.EntryPoint(
        name="histogram", value="custom_tier:HistogramTier", group=tierspec.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(tierspec, "_entry_points", lambda: {**real, "histogram": ep})
    monkeypatch.setattr(tierspec, "_registered", {})
    m = tiny_store(tmp_path)
    tier = open_tiers("histogram:2ms>ram:1MiB>pread", tmp_path, m)
    assert type(tier).__name__ == "HistogramTier" and tier.slow == pytest.approx(2e-3)  # type: ignore[attr-defined]
    asyncio.run(tier.aclose())

    import custom_tier

    hist = asyncio.run(custom_tier.demo(tmp_path))  # the script path: register_tier
    assert dict(hist.reads_per_layer) == {layer: 2 * m.n_experts for layer in m.moe_layers}


def test_failed_stack_releases_the_storage_tier(tmp_path: Path) -> None:
    m = tiny_store(tmp_path)
    before = set(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else None
    with pytest.raises(ConfigError, match="throttle needs a bandwidth"):
        open_tiers("throttle:lat=1ms>pread", tmp_path, m)
    if before is not None:
        assert set(os.listdir("/proc/self/fd")) <= before
