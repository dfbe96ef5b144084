"""The row-kernel unit chosen by timing at first use, and the choice kept per machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from edge0.kernels import isa, native


@pytest.fixture
def mod() -> Iterator[ModuleType]:
    got = native.module()
    if got is None:
        pytest.fail(f"the native kernels are not loaded: {native.status()}")
    first = got.isa()
    yield got
    got.use_isa(first)


def _simd(mod: ModuleType) -> str:
    runs = [u for u in isa.UNITS if isa._runs(mod, u)]
    if not runs:
        pytest.skip("no SIMD unit runs on this CPU: nothing to time against portable")
    return runs[0]


def test_a_slow_unit_loses_even_as_the_widest(mod: ModuleType, tmp_path: Path) -> None:
    """`portable` (scalar C++, ~5x slower here) put first, where the widest unit goes: the
    timing must find it slow and run the SIMD unit."""
    fast = _simd(mod)
    path = tmp_path / "isa.json"
    assert isa.choose(mod, path, units=("portable", fast)) == fast
    assert mod.isa() == fast
    kept = json.loads(path.read_text())[isa.machine_key(mod)]
    assert kept["unit"] == fast and kept["median_ms"]["portable"] > kept["median_ms"][fast]


def test_the_choice_is_kept_and_not_timed_again(
    mod: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _simd(mod)
    path = tmp_path / "isa.json"
    isa.choose(mod, path, units=("portable", fast))
    mod.use_isa("portable")

    def no_timing(*_: object, **__: object) -> dict[str, float]:
        raise AssertionError("timed again")

    monkeypatch.setattr(isa, "time_units", no_timing)
    assert isa.choose(mod, path, units=("portable", fast)) == fast
    assert mod.isa() == fast


def test_another_machine_s_or_a_broken_cache_is_timed_again(
    mod: ModuleType, tmp_path: Path
) -> None:
    fast = _simd(mod)
    path = tmp_path / "isa.json"
    other = {"unit": "portable", "units": ["portable", fast], "median_ms": {}}
    path.write_text(json.dumps({"another cpu|x86_64|1:2|mlx 0": other}))
    assert isa.choose(mod, path, units=("portable", fast)) == fast
    table = json.loads(path.read_text())
    assert table["another cpu|x86_64|1:2|mlx 0"] == other and len(table) == 2
    path.write_text("{not json")
    assert isa.choose(mod, path, units=("portable", fast)) == fast
    assert json.loads(path.read_text())[isa.machine_key(mod)]["unit"] == fast


def test_an_unwritable_cache_still_chooses(mod: ModuleType, tmp_path: Path) -> None:
    fast = _simd(mod)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert isa.choose(mod, blocker / "isa.json", units=("portable", fast)) == fast


def test_pick_keeps_the_widest_within_the_margin() -> None:
    units = ("avx512", "avx2")
    assert isa.pick({"avx512": [1.0, 2.0, 1.0], "avx2": [0.99, 1.98, 0.99]}, units) == "avx512"
    assert isa.pick({"avx512": [1.0, 2.0, 1.0], "avx2": [0.9, 1.8, 1.1]}, units) == "avx2"
    assert isa.pick({"avx512": [0.9, 1.0, 0.9], "avx2": [1.0, 0.5, 1.0]}, units) == "avx512"


def test_one_unit_is_used_without_timing(
    mod: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(isa, "time_units", lambda *a, **k: pytest.fail("timed one unit"))
    assert isa.choose(mod, tmp_path / "isa.json", units=("portable",)) == "portable"
    assert mod.isa() == "portable"
    assert not (tmp_path / "isa.json").exists()
