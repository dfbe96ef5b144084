"""The native float linear (nn.Linear, the prerouter heads) against MLX's matmul."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge0.kernels import layers, native, ops


@pytest.fixture(autouse=True)
def _loaded() -> None:
    if native.module() is None:
        pytest.fail(f"the native kernels are not loaded: {native.status()}")


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 300),
    cols=st.sampled_from([1, 7, 64, 100, 2048]),
    lead=st.sampled_from([(1,), (3,), (2, 5)]),
    wdt=st.sampled_from(["float32", "bfloat16", "float16"]),
    bias=st.booleans(),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_linear_agrees_with_mlx(
    rows: int,
    cols: int,
    lead: tuple[int, ...],
    wdt: str,
    bias: bool,
    threads: int,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    x = mx.array(rng.standard_normal((*lead, cols)).astype(np.float32))
    w = mx.array(rng.standard_normal((rows, cols)).astype(np.float32)).astype(getattr(mx, wdt))
    b = mx.array(rng.standard_normal((rows,)).astype(np.float32)) if bias else None
    mod = native.module()
    assert mod is not None
    before = mod.threads()
    mod.set_threads(threads)
    try:
        got = ops.linear(x, w, b)
        mx.eval(got)
    finally:
        mod.set_threads(before)
    want = x @ w.astype(mx.float32).T + (b if b is not None else 0.0)
    assert got.shape == want.shape and got.dtype == mx.float32
    # reassociated sums: the error scales with the summands, not with a sum that cancels
    # (one row of 100 products summing to 0.1 differed by 2e-6)
    mag = mx.abs(x) @ mx.abs(w.astype(mx.float32)).T + (mx.abs(b) if b is not None else 0.0)
    assert float(mx.abs(got - want).max()) <= 1e-5 * (float(mag.max()) or 1.0)


def test_an_nn_linear_switches_and_keeps_its_gradient() -> None:
    ref = nn.Linear(24, 10)
    nat = nn.Linear(24, 10)
    nat.update(ref.parameters())
    assert layers.use_native(nat) == 1 and type(nat) is layers.NativeLinear
    x = mx.random.normal((3, 24))
    assert float(mx.abs(nat(x) - ref(x)).max()) <= 1e-5 * float(mx.abs(ref(x)).max())
    g_ref = mx.grad(lambda x: (ref(x) ** 2).sum())(x)
    g_nat = mx.grad(lambda x: (nat(x) ** 2).sum())(x)
    assert float(mx.abs(g_nat - g_ref).max()) <= 1e-5 * float(mx.abs(g_ref).max())


def test_a_mismatched_input_is_one_clear_error() -> None:
    mod = native.module()
    assert mod is not None
    with pytest.raises(ValueError, match="does not match the weight's 8"):
        mod.linear(mx.zeros((1, 7)), mx.zeros((4, 8)), None)
