"""The kernels' GEMM for many input rows (a prompt chunk), on every built ISA variant.

From 8 input rows a product decodes each weight row once for all of them (gemm_impl.h).
Each row must get the bits it gets alone (the row kernel), and MLX's result within a
relative error of 1e-5; the experts' FFN over many rows per slot likewise, and a thread
count must not change a bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.activations import SwigluOAI
from mlx_lm.models.switch_layers import SwiGLU

from edge0.kernels import native, ops

TOL = 1e-5
ISAS = ("avx512", "avx2", "neon", "portable")
QUANTS = [  # (mode, bits, group)
    ("affine", 4, 32),
    ("affine", 4, 64),
    ("affine", 4, 128),
    ("affine", 8, 32),
    ("affine", 8, 64),
    ("affine", 8, 128),
    ("mxfp4", 4, 32),
]


def _native() -> Any:
    mod = native.module()
    if mod is None:
        pytest.fail(f"the native kernels are not loaded: {native.status()}")
    return mod


def _isas() -> list[str]:
    mod = _native()
    first = mod.isa()
    out = [name for name in ISAS if mod.use_isa(name)]
    mod.use_isa(first)
    return out


@pytest.fixture(scope="module")
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    mod = _native()
    first = mod.isa()
    assert mod.use_isa(request.param)
    yield request.param
    mod.use_isa(first)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "isa" in metafunc.fixturenames:
        metafunc.parametrize("isa", _isas(), indirect=True)


@pytest.fixture
def threads() -> Iterator[Any]:
    """Set the kernels' thread count in a test; the first count comes back after it."""
    mod = _native()
    first = mod.threads()
    yield mod.set_threads
    mod.set_threads(first)


def rel_err(got: mx.array, ref: mx.array) -> float:
    a, b = np.array(got, dtype=np.float64), np.array(ref, dtype=np.float64)
    assert a.shape == b.shape
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _matrix(
    rows: int, cols: int, quant: tuple[str, int, int], sdt: Any
) -> tuple[mx.array, mx.array, mx.array | None]:
    mode, bits, group = quant
    q = mx.quantize(mx.random.normal((rows, cols)), group_size=group, bits=bits, mode=mode)
    w, s = q[0], q[1]
    b = q[2] if mode == "affine" else None
    if mode == "affine":
        assert b is not None
        s, b = s.astype(sdt), b.astype(sdt)
    return w, s, b


@settings(max_examples=40, deadline=None)
@given(
    quant=st.sampled_from(QUANTS),
    sdt=st.sampled_from([mx.float32, mx.float16, mx.bfloat16]),
    m=st.integers(8, 48),
    rows=st.integers(8, 41),  # whole register tiles of weight rows and a rest
    groups=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_each_row_of_many_gets_its_bits_alone(
    isa: str, quant: tuple[str, int, int], sdt: Any, m: int, rows: int, groups: int, seed: int
) -> None:
    """Many rows against the row kernel's single row, bit for bit, and against MLX."""
    mx.random.seed(seed)
    mode, bits, group = quant
    cols = group * groups if mode == "affine" else 32 * max(groups, 2)
    w, s, b = _matrix(rows, cols, quant, sdt)
    x = mx.random.normal((m, cols))
    got = np.array(ops.qmm(x, w, s, b, group, bits, mode))
    for i in range(m):
        alone = np.array(ops.qmm(x[i : i + 1], w, s, b, group, bits, mode))[0]
        assert np.array_equal(got[i], alone), (i, m)
    ref = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=bits, mode=mode)
    assert rel_err(mx.array(got), ref) <= TOL


@pytest.mark.parametrize("quant", [("affine", 4, 64), ("affine", 8, 128), ("mxfp4", 4, 32)])
def test_two_threads_give_the_same_bits(
    isa: str, quant: tuple[str, int, int], threads: Any
) -> None:
    """A prompt chunk's product split over two threads (rows, or expert slots) changes no bit."""
    mx.random.seed(11)
    w, s, b = _matrix(512, 512, quant, mx.bfloat16)
    x = mx.random.normal((37, 512))
    mode, bits, group = quant
    threads(1)
    one = np.array(ops.qmm(x, w, s, b, group, bits, mode))
    threads(2)
    two = np.array(ops.qmm(x, w, s, b, group, bits, mode))
    assert np.array_equal(one, two)


def _stack(n: int, rows: int, cols: int, quant: tuple[str, int, int], bias: bool) -> ops.Proj:
    mode, bits, group = quant
    q = mx.quantize(mx.random.normal((n, rows, cols)) * 0.1, group_size=group, bits=bits, mode=mode)
    b = q[2] if mode == "affine" else None
    return (q[0], q[1], b, mx.random.normal((n, rows)) if bias else None, group, bits, mode)


def _reference(h: mx.array, idx: mx.array, up: Any, gate: Any, down: Any, act: Any) -> Any:
    def proj(p: Any, inp: mx.array) -> mx.array:
        w, s, b, bias, group, bits, mode = p
        out = mx.gather_qmm(
            inp, w, s, b, rhs_indices=idx, transpose=True, group_size=group, bits=bits, mode=mode
        )
        return out if bias is None else out + mx.expand_dims(bias[idx], -2)

    return proj(down, act(proj(up, h), proj(gate, h)))


@settings(max_examples=20, deadline=None)
@given(
    quant=st.sampled_from(QUANTS),
    oai=st.booleans(),
    pairs=st.integers(9, 60),
    slots=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_expert_ffn_over_many_rows_per_slot(
    isa: str, quant: tuple[str, int, int], oai: bool, pairs: int, slots: int, seed: int
) -> None:
    """A chunk's sorted pairs, many per expert slot: each pair's output is the one it gets
    alone, bit for bit, and gather_qmm's within 1e-5."""
    mx.random.seed(seed)
    d, ff = 256, 128
    up, gate = (_stack(slots, ff, d, quant, oai) for _ in range(2))
    down = _stack(slots, d, ff, quant, oai)
    act = SwigluOAI() if oai else SwiGLU()
    h = mx.random.normal((pairs, 1, d))
    idx = mx.sort(mx.random.randint(0, slots, (pairs,))).astype(mx.uint32)
    got = ops.expert_ffn(h, idx, up, gate, down, act)
    assert got is not None
    for i in range(pairs):
        alone = ops.expert_ffn(h[i : i + 1], idx[i : i + 1], up, gate, down, act)
        assert alone is not None
        assert np.array_equal(np.array(got[i]), np.array(alone[0])), i
    assert rel_err(got, _reference(h, idx, up, gate, down, act)) <= TOL
