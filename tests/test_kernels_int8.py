"""The opt-in int8-activation path of the native kernels (EDGE0_INT8_ACTIVATIONS).

Not exact, so not held to MLX's outputs: every output must lie within the bound its
rounding allows (half a quantization step of each input times the weights it meets), each
input must be rounded exactly as specified, the variant in use (AVX2's path, which AVX-512
shares) must give the portable C++'s bits, a row the same bits alone or in a batch, 8-bit
matrices must keep the float32 path, and the setting must be said in the status line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.activations import SwigluOAI
from mlx_lm.models.switch_layers import SwiGLU

from edge0.kernels import native, ops

BLOCK = 32


def _native() -> Any:
    mod = native.module()
    if mod is None:
        pytest.fail(f"the native kernels are not loaded: {native.status()}")
    return mod


@contextmanager
def _int8_on() -> Iterator[Any]:
    """The int8 path on, on the CPU's own variant; everything restored after."""
    mod = _native()
    first = mod.isa()
    if not mod.has_int8_inputs():
        pytest.skip(f"the {first} row kernel has no int8 path")
    mod.set_int8_inputs(True)
    try:
        yield mod
    finally:
        mod.set_int8_inputs(False)
        mod.use_isa(first)


@pytest.fixture
def int8() -> Iterator[Any]:
    with _int8_on() as mod:
        yield mod


def _run(mod: Any, isa: str, fn: Any) -> np.ndarray:
    assert mod.use_isa(isa)
    return np.array(fn())


def _matrix(rows: int, cols: int, group: int, mode: str, sdt: Any) -> tuple[Any, ...]:
    q = mx.quantize(mx.random.normal((rows, cols)) * 0.1, group_size=group, bits=4, mode=mode)
    w, s = q[0], q[1]
    b = q[2] if mode == "affine" else None
    if sdt is not None and b is not None:
        s, b = s.astype(sdt), b.astype(sdt)
    return w, s, b


def _bound(x: np.ndarray, w: Any, s: Any, b: Any, group: int, mode: str) -> np.ndarray:
    """(M, rows): the largest |int8 - exact| the rounding of x allows, plus float32 slack.

    Affine codes meet x centred (q - 8; the rest is the bias term, from float32 sums), MXFP4
    codes as they are; each input is off by at most half its block's step max|x| / 127."""
    full = np.array(
        mx.dequantize(w, s, b, group_size=group, bits=4, mode=mode).astype(mx.float32), np.float64
    )
    if mode == "affine":
        sc = np.repeat(np.array(s.astype(mx.float32), np.float64), group, axis=1)
        bi = np.repeat(np.array(b.astype(mx.float32), np.float64), group, axis=1)
        meets = full - (bi + 8 * sc)  # scale * (q - 8)
    else:
        meets = full
    m, cols = x.shape
    step = np.abs(x.reshape(m, cols // BLOCK, BLOCK)).max(axis=2) / 127  # (M, blocks)
    half = np.repeat(step / 2, BLOCK, axis=1)  # (M, cols)
    slack = 1e-5 * (np.abs(x) @ np.abs(full).T) + 1e-6
    return half @ np.abs(meets).T + slack


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(["affine", "mxfp4"]),
    group=st.sampled_from([32, 64, 128]),
    sdt=st.sampled_from([mx.float32, mx.float16, mx.bfloat16]),
    m=st.integers(1, 9),
    rows=st.integers(1, 40),
    blocks=st.integers(1, 9),  # odd counts: a last block without a partner
    seed=st.integers(0, 2**16),
)
def test_int8_outputs_within_the_rounding_bound_and_the_same_bits_everywhere(
    mode: str, group: int, sdt: Any, m: int, rows: int, blocks: int, seed: int
) -> None:
    with _int8_on() as int8:
        _check_bound_and_bits(int8, mode, group, sdt, m, rows, blocks, seed)


def _check_bound_and_bits(
    int8: Any, mode: str, group: int, sdt: Any, m: int, rows: int, blocks: int, seed: int
) -> None:
    group = 32 if mode == "mxfp4" else group
    cols = BLOCK * blocks
    cols = -(-cols // group) * group
    mx.random.seed(seed)
    w, s, b = _matrix(rows, cols, group, mode, sdt)
    x = mx.random.normal((m, cols)) * mx.exp(mx.random.normal((m, 1)))
    ref = np.array(
        mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=4, mode=mode),
        np.float64,
    )
    first = int8.isa()
    got = _run(int8, first, lambda: ops.qmm(x, w, s, b, group, 4, mode))
    assert np.all(np.abs(got - ref) <= _bound(np.array(x, np.float64), w, s, b, group, mode))
    portable = _run(int8, "portable", lambda: ops.qmm(x, w, s, b, group, 4, mode))
    assert np.array_equal(got, portable)
    int8.use_isa(first)
    for i in range(m):  # a row alone gives the bits it gets in the batch
        assert np.array_equal(np.array(ops.qmm(x[i : i + 1], w, s, b, group, 4, mode))[0], got[i])


def test_int8_differs_from_float32_and_is_off_by_default() -> None:
    """The path really runs when asked (its outputs are not float32's) and never unasked."""
    mod = _native()
    assert not mod.int8_inputs()
    mx.random.seed(1)
    w, s, b = _matrix(64, 256, 64, "affine", None)
    x = mx.random.normal((2, 256))
    base = np.array(ops.qmm(x, w, s, b, 64, 4))
    mod.set_int8_inputs(True)
    try:
        on = np.array(ops.qmm(x, w, s, b, 64, 4))
    finally:
        mod.set_int8_inputs(False)
    assert not np.array_equal(on, base)
    assert np.array_equal(np.array(ops.qmm(x, w, s, b, 64, 4)), base)


def test_eight_bit_matrices_keep_float32(int8: Any) -> None:
    mx.random.seed(2)
    w, s, b = mx.quantize(mx.random.normal((40, 256)), group_size=64, bits=8)
    x = mx.random.normal((3, 256))
    on = np.array(ops.qmm(x, w, s, b, 64, 8))
    int8.set_int8_inputs(False)
    assert np.array_equal(on, np.array(ops.qmm(x, w, s, b, 64, 8)))


def test_non_finite_inputs_give_non_finite_outputs(int8: Any) -> None:
    """A block holding inf or NaN makes its row's outputs NaN (never a finite guess)."""
    mx.random.seed(3)
    w, s, b = _matrix(16, 128, 64, "affine", None)
    x = np.array(mx.random.normal((3, 128)))
    x[0, 5], x[2, 100] = np.inf, np.nan
    got = np.array(ops.qmm(mx.array(x), w, s, b, 64, 4))
    assert np.isnan(got[0]).all() and np.isnan(got[2]).all()
    assert np.isfinite(got[1]).all()


@pytest.mark.parametrize("mode", ["affine", "mxfp4"])
def test_expert_ffn_int8_same_bits_on_every_variant_and_near_float32(int8: Any, mode: str) -> None:
    mx.random.seed(4)
    n, d, ff, group = 6, 96, 64, 32  # 96: three blocks, one without a partner
    oai = mode == "mxfp4"

    def stack(rows: int, cols: int) -> ops.Proj:
        q = mx.quantize(
            mx.random.normal((n, rows, cols)) * 0.1, group_size=group, bits=4, mode=mode
        )
        bias = mx.random.normal((n, rows)) * 0.1 if oai else None
        return (q[0], q[1], q[2] if mode == "affine" else None, bias, group, 4, mode)

    up, gate, down = stack(ff, d), stack(ff, d), stack(d, ff)
    act = SwigluOAI() if oai else SwiGLU()
    h = mx.random.normal((5, 1, 1, d))
    idx = mx.array(np.random.default_rng(0).integers(0, n, (5, 1, 3)).astype(np.uint32))
    first = int8.isa()
    got = _run(int8, first, lambda: ops.expert_ffn(h, idx, up, gate, down, act))
    assert np.array_equal(
        got, _run(int8, "portable", lambda: ops.expert_ffn(h, idx, up, gate, down, act))
    )
    int8.use_isa(first)
    int8.set_int8_inputs(False)
    ref = np.array(ops.expert_ffn(h, idx, up, gate, down, act))
    assert not np.array_equal(got, ref)
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()


def test_the_setting_is_read_from_the_environment_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = _native()
    monkeypatch.setenv("EDGE0_INT8_ACTIVATIONS", "1")
    native.reset()
    try:
        assert native.module() is mod
        if mod.has_int8_inputs():
            assert mod.int8_inputs()
            assert native.status().endswith(", int8 activations (EDGE0_INT8_ACTIVATIONS)")
        else:
            assert "int8 activations asked for: not built for" in native.status()
    finally:
        monkeypatch.delenv("EDGE0_INT8_ACTIVATIONS")
        native.reset()
        native.module()
    assert not mod.int8_inputs()
    assert "int8" not in native.status()


def test_an_unknown_value_is_refused_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _native()
    monkeypatch.setenv("EDGE0_INT8_ACTIVATIONS", "maybe")
    native.reset()
    try:
        assert native.module() is mod
        assert not mod.int8_inputs()
        assert native.status().endswith(
            "(EDGE0_INT8_ACTIVATIONS='maybe' is neither 1 nor 0: float32 runs)"
        )
        monkeypatch.setenv("EDGE0_INT8_ACTIVATIONS", " Off ")
        native.reset()
        assert "int8" not in native.status()
    finally:
        monkeypatch.delenv("EDGE0_INT8_ACTIVATIONS")
        native.reset()
        native.module()


@pytest.mark.parametrize("cols", [96, 256])  # 96: three blocks, one without a partner
def test_each_input_is_rounded_to_the_nearest_step_of_its_block(int8: Any, cols: int) -> None:
    """Through a diagonal matrix (exact in MXFP4) each output is its input as the int8 path
    sees it: step * round-half-even(x / step), step = max|x| of its block of 32 / 127, times
    the weight (twice the e2m1 value times half the step, then the weight's power-of-two
    scale: one rounding)."""
    eye = mx.eye(cols) * 2.0
    w, s = mx.quantize(eye, group_size=32, bits=4, mode="mxfp4")[:2]
    deq = np.array(mx.dequantize(w, s, None, 32, 4, mode="mxfp4").astype(mx.float32))
    assert np.array_equal(deq, np.array(eye))
    sw = np.exp2(np.array(s).astype(np.float64) - 127).astype(np.float32)  # (cols, blocks)
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((3, cols)) * rng.uniform(0.01, 100, (3, 1))).astype(np.float32)
    got = np.array(ops.qmm(mx.array(x), w, s, None, 32, 4, "mxfp4"))
    blocks = x.reshape(3, cols // 32, 32)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    q = np.round(blocks * (np.float32(127) / amax)).reshape(3, cols)  # half to even
    half_step = np.repeat((amax / np.float32(127)) * np.float32(0.5), 32, axis=2).reshape(3, cols)
    diag = np.arange(cols)
    w_sw = sw[diag, diag // 32]  # the scale of each row's one weight
    twice_v = (np.float32(2.0) / w_sw) * 2  # the code as the kernel reads it
    want = (twice_v * q).astype(np.float32) * (w_sw * half_step).astype(np.float32)
    assert np.array_equal(got, want)
