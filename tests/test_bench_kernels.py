"""`edge0 bench kernels` on the demo's small shapes: every case measured, ratios per round."""

from __future__ import annotations

import pytest

from edge0.bench import kernels as bench
from edge0.kernels import native


def test_every_case_has_per_round_ratios(monkeypatch: pytest.MonkeyPatch) -> None:
    if native.module() is None:
        pytest.skip(f"no native kernels here: {native.status()}")
    small = bench.memory_bandwidth
    monkeypatch.setattr(bench, "memory_bandwidth", lambda: small(mib=4, rounds=1))
    res = bench.run_bench(["demo"], [1, 2], rounds=3, threads=[1], footprint_mib=1)
    cases = res["cases"]
    assert [(c["kernel"].split()[0], c["m"]) for c in cases] == [
        ("expert", 1),
        ("q_proj", 1),
        ("o_proj", 1),
        ("expert", 2),
        ("q_proj", 2),
        ("o_proj", 2),
    ]
    for c in cases:
        native_1t, mlx = c["native 1t"]["rounds"], c["mlx"]["rounds"]
        assert len(native_1t) == len(mlx) == len(c["ratio_rounds"]) == 3
        want = [n / m for n, m in zip(native_1t, mlx, strict=True)]
        assert c["ratio_rounds"] == pytest.approx(want)
        assert min(c["ratio_rounds"]) <= c["ratio_median"] <= max(c["ratio_rounds"])
    table = bench.markdown(res)
    assert "median of per-round ratios" in table
    assert table.count("\n| demo |") == 6


def test_the_int8_variant_runs_in_the_same_rounds_and_is_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = native.module()
    if mod is None or not mod.has_int8_inputs():
        pytest.skip(f"no native int8 path here: {native.status()}")
    small = bench.memory_bandwidth
    monkeypatch.setattr(bench, "memory_bandwidth", lambda: small(mib=4, rounds=1))
    res = bench.run_bench(["demo"], [1], rounds=2, threads=[1], footprint_mib=1, int8=True)
    for c in res["cases"]:
        int8, mlx = c[bench.INT8]["rounds"], c["mlx"]["rounds"]
        assert c["int8_ratio_rounds"] == pytest.approx(
            [a / b for a, b in zip(int8, mlx, strict=True)]
        )
        assert 0 < c["int8_rel_err"] < 0.05  # it ran, and stayed near float32
    assert not mod.int8_inputs()
    table = bench.markdown(res)
    assert "| int8 / mlx | int8 max rel. error |" in table
