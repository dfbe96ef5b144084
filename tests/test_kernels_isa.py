"""The row-kernel unit chosen by timing at first use, and the choice kept per machine."""

from __future__ import annotations

import json
import platform
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import mlx.core as mx
import pytest

from edge0.kernels import isa, native


@pytest.fixture
def mod() -> Iterator[ModuleType]:
    got = native.module()
    if got is None:
        pytest.fail(f"the native kernels are not loaded: {native.status()}")
    first = {kind: got.isa(kind) for kind in isa.KINDS}
    yield got
    for kind, unit in first.items():
        got.use_isa(unit, kind)


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
    assert isa.choose(mod, path, units=("portable", fast)) == {k: fast for k in isa.KINDS}
    assert mod.isa("affine") == mod.isa("mxfp4") == fast
    kept = json.loads(path.read_text())[isa.machine_key(mod)]
    assert kept["unit"] == {k: fast for k in isa.KINDS}
    for kind in isa.KINDS:
        assert kept["median_ms"][kind]["portable"] > kept["median_ms"][kind][fast]


def test_each_kind_runs_the_unit_timed_fastest_for_it(
    mod: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit slow for one kind of matrix and fast for the other (the timing forced so) is
    chosen for the other alone, and each kind's products then run their own unit."""
    fast = _simd(mod)
    real = isa.time_units

    def slow_affine(m: ModuleType, units: object, rounds: int = 3, kind: str = "affine"):
        got = real(m, units, rounds=3, kind=kind)  # type: ignore[arg-type]
        if kind == "affine":  # the SIMD unit made 10x slower for affine matrices only
            got[fast] = [t * 10 for t in got[fast]]
        return got

    monkeypatch.setattr(isa, "time_units", slow_affine)
    chosen = isa.choose(mod, tmp_path / "isa.json", units=(fast, "portable"))
    assert chosen == {"affine": "portable", "mxfp4": fast}
    assert mod.isa() == mod.isa("affine") == "portable" and mod.isa("mxfp4") == fast
    assert native.units_line(mod) == f"portable (MXFP4: {fast})"
    # each kind's products run on its unit: the same results as the other unit's, to float
    # rounding (a unit's lane width orders its sums)
    x, mats = isa.problem()
    w, s, b = mats[0]
    e = mx.random.randint(120, 123, (w.shape[0], w.shape[1] * 8 // 32)).astype(mx.uint8)
    got = [mod.qmm(x, w, s, b, 64, 4, "affine"), mod.qmm(x, w, e, None, 32, 4, "mxfp4")]
    mod.use_isa(fast)
    want = [mod.qmm(x, w, s, b, 64, 4, "affine"), mod.qmm(x, w, e, None, 32, 4, "mxfp4")]
    for g, ww in zip(got, want, strict=True):
        assert mx.allclose(g, ww, rtol=1e-5, atol=1e-5).item()


def test_a_kind_is_named_or_refused(mod: ModuleType) -> None:
    fast = _simd(mod)
    assert mod.use_isa(fast)
    assert mod.use_isa("portable", "mxfp4") and mod.isa("mxfp4") == "portable"
    assert mod.isa("affine") == mod.isa() == fast
    with pytest.raises(ValueError, match="kind must be 'affine' or 'mxfp4'"):
        mod.use_isa(fast, "int8")


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
    assert isa.choose(mod, path, units=("portable", fast)) == {k: fast for k in isa.KINDS}
    assert mod.isa() == fast


def test_another_machine_s_or_a_broken_cache_is_timed_again(
    mod: ModuleType, tmp_path: Path
) -> None:
    fast = _simd(mod)
    path = tmp_path / "isa.json"
    other = {"unit": {"affine": "portable"}, "units": ["portable", fast], "median_ms": {}}
    path.write_text(json.dumps({"another cpu|x86_64|1:2|mlx 0": other}))
    assert isa.choose(mod, path, units=("portable", fast))["affine"] == fast
    table = json.loads(path.read_text())
    assert table["another cpu|x86_64|1:2|mlx 0"] == other and len(table) == 2
    path.write_text("{not json")
    assert isa.choose(mod, path, units=("portable", fast))["mxfp4"] == fast
    assert json.loads(path.read_text())[isa.machine_key(mod)]["unit"]["affine"] == fast


def test_an_unwritable_cache_still_chooses(mod: ModuleType, tmp_path: Path) -> None:
    fast = _simd(mod)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert isa.choose(mod, blocker / "isa.json", units=("portable", fast))["affine"] == fast


def test_pick_keeps_the_widest_within_the_margin() -> None:
    units = ("avx512", "avx2")
    assert isa.pick({"avx512": [1.0, 2.0, 1.0], "avx2": [0.99, 1.98, 0.99]}, units) == "avx512"
    assert isa.pick({"avx512": [1.0, 2.0, 1.0], "avx2": [0.9, 1.8, 1.1]}, units) == "avx2"
    assert isa.pick({"avx512": [0.9, 1.0, 0.9], "avx2": [1.0, 0.5, 1.0]}, units) == "avx512"


def test_one_unit_is_used_without_timing(
    mod: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(isa, "time_units", lambda *a, **k: pytest.fail("timed one unit"))
    got = isa.choose(mod, tmp_path / "isa.json", units=("portable",))
    assert got == {"affine": "portable", "mxfp4": "portable"}
    assert mod.isa() == mod.isa("mxfp4") == "portable"
    assert not (tmp_path / "isa.json").exists()


class _Spy:
    """The extension, with `evict` recorded: which arrays each timed pass dropped."""

    def __init__(self, mod: ModuleType) -> None:
        self._mod = mod
        self.evicted: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._mod, name)

    def evict(self, arrays: list[mx.array]) -> bool:
        self.evicted.append(sum(a.nbytes for a in arrays))
        return bool(self._mod.evict(arrays))


def test_every_timed_pass_reads_its_weights_from_memory(mod: ModuleType) -> None:
    """Each unit's and each thread count's pass first drops the timed weights from the caches,
    as a decode step meets its weights: every operand the pass reads, before every pass."""
    from edge0.kernels import threads

    fast = _simd(mod)
    _, mats = isa.problem()
    weights = sum(a.nbytes for m in mats for a in m)
    spy = _Spy(mod)
    got = isa.time_units(spy, (fast, "portable"), rounds=2, kind="mxfp4")  # type: ignore[arg-type]
    assert {u: len(t) for u, t in got.items()} == {fast: 2, "portable": 2}
    assert len(spy.evicted) == 3 * 2  # (rounds + the warm-up) x units
    codes = sum(w.nbytes for w, _, _ in mats)  # MXFP4 reads the codes and its e8m0 scales
    assert all(n == codes + codes // 16 for n in spy.evicted)
    spy.evicted.clear()
    threads.time_counts(spy, "decode", (1, 2), rounds=2)  # type: ignore[arg-type]
    assert len(spy.evicted) == 3 * 2 and all(n == weights for n in spy.evicted)


def test_evict_keeps_values_and_refuses_an_unevaluated_array(mod: ModuleType) -> None:
    x, mats = isa.problem()
    w, s, b = mats[0]
    before = mod.qmm(x, w, s, b, 64, 4, "affine")
    mx.eval(before)
    assert mod.evict([w, s, b, x]) is (platform.machine() in ("x86_64", "AMD64"))
    assert mx.array_equal(mod.qmm(x, w, s, b, 64, 4, "affine"), before).item()
    if platform.machine() in ("x86_64", "AMD64"):
        with pytest.raises(ValueError, match="evaluate the arrays first"):
            mod.evict([w + 1])
