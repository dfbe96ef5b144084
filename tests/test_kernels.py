"""The native CPU kernels (edge0.kernels) against MLX's own ops, on every built ISA variant.

`qmm` against `mx.quantized_matmul`, `expert_ffn` against three `gather_qmm` calls and the
activation (over strided slot views too), their gradients against MLX's, the fallback
(`EDGE0_NATIVE_KERNELS=0`), and a loaded model's greedy tokens with and without them.
The tolerance is a relative error of 1e-5 (max |diff| / max |reference| over a call's
outputs, at least 8 of them): the kernels differ from MLX only in summation order.
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


def rel_err(got: mx.array, ref: mx.array) -> float:
    a, b = np.array(got, dtype=np.float64), np.array(ref, dtype=np.float64)
    assert a.shape == b.shape
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def test_the_native_path_is_active_here() -> None:
    """CI builds the extension: a silent fallback would hide every test below."""
    mod = _native()
    with native.prompt_threads() as prompt:
        assert prompt >= 1
    assert (
        native.status()
        == f"kernels: native {native.units_line(mod)}, {mod.threads()} thread"
        + ("s" if mod.threads() != 1 else "")
        + f" (prompts {prompt})"
    )


@settings(max_examples=60, deadline=None)
@given(
    bits=st.sampled_from([4, 8]),
    group=st.sampled_from([32, 64, 128]),
    sdt=st.sampled_from([mx.float32, mx.float16, mx.bfloat16]),
    m=st.integers(1, 9),
    rows=st.integers(8, 70),  # one output alone can cancel: see docs/kernels.md, Exactness
    groups=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_qmm_matches_quantized_matmul(
    isa: str, bits: int, group: int, sdt: Any, m: int, rows: int, groups: int, seed: int
) -> None:
    mx.random.seed(seed)
    cols = group * groups
    w, s, b = mx.quantize(mx.random.normal((rows, cols)), group_size=group, bits=bits)
    s, b = s.astype(sdt), b.astype(sdt)
    x = mx.random.normal((m, cols))
    ref = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=bits)
    assert rel_err(ops.qmm(x, w, s, b, group, bits), ref) <= TOL


@pytest.mark.parametrize("m", [1, 3, 8])
def test_qmm_mxfp4_and_leading_dims(isa: str, m: int) -> None:
    mx.random.seed(m)
    w, s = mx.quantize(mx.random.normal((48, 256)), group_size=32, bits=4, mode="mxfp4")[:2]
    x = mx.random.normal((2, m, 256))
    ref = mx.quantized_matmul(x, w, s, None, transpose=True, group_size=32, bits=4, mode="mxfp4")
    got = ops.qmm(x, w, s, None, 32, 4, "mxfp4")
    assert got.shape == (2, m, 48)
    assert rel_err(got, ref) <= TOL


@pytest.mark.parametrize(
    ("bits", "group", "mode", "sdt"),
    [
        (4, 64, "affine", mx.bfloat16),
        (8, 32, "affine", mx.float16),
        (4, 128, "affine", mx.float32),
        (4, 32, "mxfp4", None),
    ],
)
def test_a_row_gives_the_same_bits_in_any_batch(
    isa: str, bits: int, group: int, mode: str, sdt: Any
) -> None:
    """Each input row's outputs are bit-identical whether it runs alone or among M rows
    (every tile shape): batched decode and chunked prefill then equal single decode."""
    mx.random.seed(bits + group)
    cols = group * 13  # 13 groups: the bias sums' 8-wide blocks and their tail
    q = mx.quantize(mx.random.normal((37, cols)), group_size=group, bits=bits, mode=mode)
    w, s = q[0], q[1]
    b = q[2] if mode == "affine" else None
    if sdt is not None:
        s, b = s.astype(sdt), (b.astype(sdt) if b is not None else None)
    x = mx.random.normal((9, cols))
    alone = [np.array(ops.qmm(x[i : i + 1], w, s, b, group, bits, mode)) for i in range(9)]
    for m in range(1, 10):
        got = np.array(ops.qmm(x[:m], w, s, b, group, bits, mode))
        for i in range(m):
            assert np.array_equal(got[i], alone[i][0]), (m, i)


Proj = tuple[mx.array, mx.array, "mx.array | None", "mx.array | None", int, int, str]


def _stack(
    n: int, rows: int, cols: int, group: int, bits: int, mode: str, bias: bool, pad: int
) -> Proj:
    """n quantized (rows, cols) matrices, as strided views when `pad` > 0 (slot memory)."""
    q = mx.quantize(mx.random.normal((n, rows, cols)) * 0.1, group_size=group, bits=bits, mode=mode)
    arrs = [q[0], q[1], q[2] if mode == "affine" else None]

    def strided(a: mx.array | None) -> mx.array | None:
        if a is None or pad == 0:
            return a
        wide = mx.zeros((n + 1, rows, a.shape[-1] + pad), dtype=a.dtype)
        wide[:n, :, : a.shape[-1]] = a
        mx.eval(wide)
        return wide[:n, :, : a.shape[-1]]

    w, s, b = (strided(a) for a in arrs)
    assert w is not None and s is not None
    return (w, s, b, mx.random.normal((n, rows)) if bias else None, group, bits, mode)


def _reference(h: mx.array, idx: mx.array, up: Proj, gate: Proj, down: Proj, act: Any) -> Any:
    def proj(p: Proj, inp: mx.array) -> mx.array:
        w, s, b, bias, group, bits, mode = p
        out = mx.gather_qmm(
            inp, w, s, b, rhs_indices=idx, transpose=True, group_size=group, bits=bits, mode=mode
        )
        return out if bias is None else out + mx.expand_dims(bias[idx], -2)

    return proj(down, act(proj(up, h), proj(gate, h)))


@settings(max_examples=40, deadline=None)
@given(
    quant=st.sampled_from(
        [
            ("affine", 4, 32),
            ("affine", 4, 64),
            ("affine", 4, 128),
            ("affine", 8, 64),
            ("mxfp4", 4, 32),
        ]
    ),
    oai=st.booleans(),
    rows=st.integers(1, 5),
    k=st.integers(1, 8),
    pad=st.sampled_from([0, 3]),
    seed=st.integers(0, 2**16),
)
def test_expert_ffn_matches_gather_qmm(
    isa: str, quant: tuple[str, int, int], oai: bool, rows: int, k: int, pad: int, seed: int
) -> None:
    mode, bits, group = quant
    mx.random.seed(seed)
    n, d, ff = 9, 256, 128
    up, gate = (_stack(n, ff, d, group, bits, mode, oai, pad) for _ in range(2))
    down = _stack(n, d, ff, group, bits, mode, oai, pad)
    act = SwigluOAI() if oai else SwiGLU()
    h = mx.random.normal((rows, 1, 1, 1, d))
    idx = mx.random.randint(0, n, (rows, 1, k)).astype(mx.uint32)  # repeats share a slot
    got = ops.expert_ffn(h, idx, up, gate, down, act)
    assert got is not None and got.shape == (rows, 1, k, 1, d)
    assert rel_err(got, _reference(h, idx, up, gate, down, act)) <= TOL


def test_expert_ffn_sorted_pairs_and_unknown_activation() -> None:
    mx.random.seed(3)
    up, gate = (_stack(4, 64, 128, 64, 4, "affine", False, 0) for _ in range(2))
    down = _stack(4, 128, 64, 64, 4, "affine", False, 0)
    h = mx.random.normal((6, 1, 128))
    idx = mx.array([0, 0, 1, 3, 3, 3], dtype=mx.uint32)  # prefill's sorted pairs
    got = ops.expert_ffn(h, idx, up, gate, down, SwiGLU())
    assert got is not None
    assert rel_err(got, _reference(h, idx, up, gate, down, SwiGLU())) <= TOL
    assert ops.expert_ffn(h, idx, up, gate, down, object()) is None  # MLX's ops run it


def test_gradients_flow_to_x_as_mlx_computes_them() -> None:
    mx.random.seed(4)
    w, s, b = mx.quantize(mx.random.normal((64, 256)), group_size=64, bits=4)
    x = mx.random.normal((3, 256))
    got = mx.grad(lambda x: ops.qmm(x, w, s, b, 64, 4).sum())(x)
    ref = mx.grad(lambda x: mx.quantized_matmul(x, w, s, b, group_size=64, bits=4).sum())(x)
    assert rel_err(got, ref) <= TOL
    up, gate = (_stack(5, 64, 128, 64, 4, "affine", True, 0) for _ in range(2))
    down = _stack(5, 128, 64, 64, 4, "affine", True, 0)
    h = mx.random.normal((2, 1, 1, 1, 128))
    idx = mx.array([[[0, 3]], [[4, 3]]], dtype=mx.uint32)
    act = SwigluOAI()

    def native_sum(h: mx.array) -> mx.array:
        out = ops.expert_ffn(h, idx, up, gate, down, act)
        assert out is not None
        return out.sum()

    got = mx.grad(native_sum)(h)
    ref = mx.grad(lambda h: _reference(h, idx, up, gate, down, act).sum())(h)
    assert rel_err(got, ref) <= TOL


def test_bad_operands_are_refused_at_graph_build() -> None:
    mod = _native()
    w, s, b = mx.quantize(mx.random.normal((8, 64)), group_size=32, bits=4)
    with pytest.raises(ValueError, match="does not match"):
        mod.qmm(mx.zeros((1, 32)), w, s, b, 32, 4, "affine")
    with pytest.raises(ValueError, match="group size"):
        mod.qmm(mx.zeros((1, 64)), w, s, b, 16, 4, "affine")
    with pytest.raises(ValueError, match="float32"):
        mod.qmm(mx.zeros((1, 64), dtype=mx.float16), w, s, b, 32, 4, "affine")


def test_fallback_runs_mlx_own_ops(mlx_only: None) -> None:
    assert native.module() is None
    assert native.status() == "kernels: MLX's own ops (EDGE0_NATIVE_KERNELS=0)"
    w, s, b = mx.quantize(mx.random.normal((16, 64)), group_size=32, bits=4)
    x = mx.random.normal((2, 64))
    ref = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=32, bits=4)
    assert np.array_equal(np.array(ops.qmm(x, w, s, b, 32, 4)), np.array(ref))
    up = _stack(2, 32, 64, 32, 4, "affine", False, 0)
    assert (
        ops.expert_ffn(mx.zeros((1, 1, 64)), mx.zeros((1,), mx.uint32), up, up, up, SwiGLU())
        is None
    )


def test_bad_settings_fall_back_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value, why in (
        ("EDGE0_KERNEL_THREADS", "two", "is not a whole number"),
        ("EDGE0_KERNEL_THREADS", "0", "outside 1..64"),
        ("EDGE0_KERNEL_ISA", "sse9", "not built or not supported"),
        ("EDGE0_PROMPT_THREADS", "all", "is not a whole number"),
    ):
        monkeypatch.setenv(var, value)
        native.reset()
        assert native.module() is None
        assert why in native.status()
        monkeypatch.delenv(var)
    native.reset()
    assert native.module() is not None


def _greedy(path: Any, n: int = 12) -> list[int]:
    from edge0.model.generate import SamplingSettings, generate
    from edge0.model.loader import load

    loaded = load(path)
    prompt = [5, 17, 42, 7, 99]
    return [p.token for p in generate(loaded, prompt, SamplingSettings(max_tokens=n, temp=0.0))]


def test_tiny_model_tokens_equal_with_and_without_native(
    tiny_model_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _greedy(tiny_model_path)
    monkeypatch.setenv("EDGE0_NATIVE_KERNELS", "0")
    native.reset()
    try:
        ref = _greedy(tiny_model_path)
    finally:
        monkeypatch.delenv("EDGE0_NATIVE_KERNELS")
        native.reset()
    assert got == ref
