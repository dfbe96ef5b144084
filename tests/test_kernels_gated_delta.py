"""The native Gated-DeltaNet op against mlx-lm's composed layer: bit for bit, step after step.

A layer switched by `use_native` (Qwen3.5's and Qwen3-Next's) must give the outputs and the
caches (conv rows, recurrent state) of mlx-lm's own layer exactly, over prompts and decode
steps fed in turn, for any head shapes, conv size, parameter dtype and thread count; and it
must hand back to mlx-lm's path where the native op does not run (a padding mask).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3_5, qwen3_next
from mlx_lm.models.cache import ArraysCache

from edge0.kernels import layers, native


@pytest.fixture(autouse=True)
def _loaded() -> None:
    if native.module() is None:
        pytest.fail(f"the native kernels are not loaded: {native.status()}")


def _pair(
    cls: type, hk: int, dk: int, ratio: int, dv: int, conv: int, dtype: str, seed: int
) -> tuple[nn.Module, nn.Module]:
    """mlx-lm's layer and the same weights switched to the native one."""
    d = 48
    common: dict[str, Any] = dict(
        hidden_size=d,
        linear_num_key_heads=hk,
        linear_key_head_dim=dk,
        linear_num_value_heads=hk * ratio,
        linear_value_head_dim=dv,
        linear_conv_kernel_dim=conv,
        num_attention_heads=4,
        rms_norm_eps=1e-6,
    )
    if cls is qwen3_5.GatedDeltaNet:
        args: Any = qwen3_5.TextModelArgs(model_type="qwen3_5", **common)
    else:
        args = qwen3_next.ModelArgs(
            model_type="qwen3_next",
            num_hidden_layers=1,
            intermediate_size=32,
            num_experts=0,
            num_experts_per_tok=0,
            decoder_sparse_step=1,
            shared_expert_intermediate_size=0,
            mlp_only_layers=[],
            moe_intermediate_size=0,
            vocab_size=16,
            num_key_value_heads=2,
            rope_theta=1e4,
            partial_rotary_factor=0.25,
            max_position_embeddings=64,
            head_dim=8,
            **common,
        )
    rng = np.random.default_rng(seed)
    flat = [
        (k, mx.array((rng.standard_normal(v.shape) * 0.3).astype(np.float32)))
        for k, v in tree_flatten(cls(args).parameters())
    ]
    # the activations stay float32; the gates' and the norm's parameters may be narrower
    narrow = ("A_log", "dt_bias", "norm.weight")
    flat = [(k, v.astype(getattr(mx, dtype)) if k in narrow else v) for k, v in flat]
    ref, nat = cls(args), cls(args)
    for m in (ref, nat):
        m.load_weights(flat)
        m.eval()
    assert layers.use_native(nat) >= 1
    assert type(nat).__name__.startswith("Native")
    for _, m in nat.named_modules():  # the float projections stay MLX's: the node is tested
        if type(m) is layers.NativeLinear:  # (the native linear reassociates its sums)
            m.__class__ = nn.Linear
    return ref, nat


def _same(a: mx.array, b: mx.array) -> bool:
    return a.shape == b.shape and bool(mx.array_equal(a, b).item())


@settings(max_examples=40, deadline=None)
@given(
    family=st.sampled_from([qwen3_5.GatedDeltaNet, qwen3_next.Qwen3NextGatedDeltaNet]),
    hk=st.integers(1, 3),
    dk=st.sampled_from([8, 12, 16, 24]),
    ratio=st.sampled_from([1, 2, 3]),
    dv=st.sampled_from([8, 12, 16]),
    conv=st.sampled_from([2, 4]),
    batch=st.integers(1, 2),
    steps=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    threads=st.sampled_from([1, 2]),
    unit=st.sampled_from(["in use", "portable", "avx2", "avx512", "neon"]),
    seed=st.integers(0, 2**16),
)
def test_native_layer_equals_mlx_lm_bit_for_bit(
    family: type,
    hk: int,
    dk: int,
    ratio: int,
    dv: int,
    conv: int,
    batch: int,
    steps: list[int],
    dtype: str,
    threads: int,
    unit: str,
    seed: int,
) -> None:
    """Every row-kernel unit this CPU runs (the SIMD units update eight state rows at once,
    with a scalar tail where Dv is not a multiple of 8)."""
    ref, nat = _pair(family, hk, dk, ratio, dv, conv, dtype, seed)
    mod = native.module()
    assert mod is not None
    before, first = mod.threads(), mod.isa("affine")
    if unit != "in use" and not mod.use_isa(unit, "affine"):
        return  # not built or not run by this CPU
    mod.set_threads(threads)
    try:
        rng = np.random.default_rng(seed + 1)
        c_ref, c_nat = ArraysCache(2), ArraysCache(2)
        for t in steps:  # a prompt piece or a decode step, the caches carried over
            x = mx.array(rng.standard_normal((batch, t, 48)).astype(np.float32))
            y_ref, y_nat = ref(x, cache=c_ref), nat(x, cache=c_nat)
            mx.eval(y_ref, y_nat, c_ref.cache, c_nat.cache)
            assert _same(y_nat, y_ref)
            assert _same(c_nat[0], c_ref[0]) and _same(c_nat[1], c_ref[1])
        y_ref, y_nat = ref(x), nat(x)  # no cache: zero states
        assert _same(y_nat, y_ref)
    finally:
        mod.set_threads(before)
        mod.use_isa(first, "affine")


def test_a_padding_mask_runs_mlx_lm_s_path() -> None:
    ref, nat = _pair(qwen3_5.GatedDeltaNet, 2, 16, 2, 16, 4, "float32", 3)
    x = mx.random.normal((2, 5, 48))
    mask = mx.array([[True] * 5, [False, False, True, True, True]])
    c_ref, c_nat = ArraysCache(2), ArraysCache(2)
    assert _same(nat(x, mask, c_nat), ref(x, mask, c_ref))


def test_a_subclass_keeps_its_own_call() -> None:
    """A family's subclass of the layer (another conv activation than SiLU, say) is not
    switched: the native node computes SiLU, so the subclass's own call must run."""

    class OtherActivation(qwen3_5.GatedDeltaNet):
        pass

    layer, _ = _pair(qwen3_5.GatedDeltaNet, 1, 8, 1, 8, 4, "float32", 0)
    layer.__class__ = OtherActivation
    layers.use_native(layer)
    assert type(layer) is OtherActivation


def test_another_conv_activation_runs_mlx_lm_s_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer whose `conv_activation` (edge0.model.hybrid) is not SiLU keeps its own call,
    whatever its class: the node computes SiLU."""
    _, nat = _pair(qwen3_5.GatedDeltaNet, 1, 8, 1, 8, 4, "float32", 1)
    object.__setattr__(nat, "conv_activation", "gelu")

    class NodeRan(Exception):
        pass

    def node(*_: object, **__: object) -> None:
        raise NodeRan

    monkeypatch.setattr(layers, "gated_delta", node)
    monkeypatch.setattr(qwen3_5.GatedDeltaNet, "__call__", lambda self, *a, **k: "mlx-lm")
    assert nat(mx.zeros((1, 2, 48))) == "mlx-lm"
    object.__setattr__(nat, "conv_activation", "silu")
    with pytest.raises(NodeRan):  # SiLU: the node
        nat(mx.zeros((1, 2, 48)))


def test_a_replaced_norm_runs_mlx_lm_s_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node computes the gated norm itself: a module put in the norm's place (a wrapper,
    another norm) must be called, so the layer runs mlx-lm's path."""
    ref, nat = _pair(qwen3_5.GatedDeltaNet, 2, 16, 2, 16, 4, "float32", 5)
    calls: list[int] = []

    class Wrapped(nn.Module):
        def __init__(self, real: nn.Module) -> None:
            super().__init__()
            self.real = real

        def __call__(self, *args: mx.array) -> mx.array:
            calls.append(1)
            return self.real(*args)

    nat.norm = Wrapped(nat.norm)
    monkeypatch.setattr(layers, "gated_delta", lambda *a, **k: pytest.fail("native node ran"))
    x = mx.random.normal((1, 3, 48))
    assert _same(nat(x), ref(x)) and calls


def test_a_bad_shape_is_one_clear_error() -> None:
    mod = native.module()
    assert mod is not None
    z = mx.zeros((1, 1, 2, 8))
    with pytest.raises(ValueError, match="qkv's width"):
        mod.gated_delta(
            mx.zeros((1, 1, 30)),
            z,
            mx.zeros((1, 1, 2)),
            mx.zeros((1, 1, 2)),
            mx.zeros((1, 3, 30)),
            mx.zeros((30, 4, 1)),
            mx.zeros((1, 2, 8, 8)),
            mx.zeros((2,)),
            mx.zeros((2,)),
            mx.zeros((8,)),
            1,
            8,
            2,
            8,
            1.0,
            1.0,
            1e-6,
            1e-6,
        )


@pytest.mark.parametrize("family", [qwen3_5.GatedDeltaNet, qwen3_next.Qwen3NextGatedDeltaNet])
def test_gradients_are_mlx_lm_s(family: type) -> None:
    """LoRA training differentiates through the layer: the native op's gradients are those of
    mlx-lm's composed ops, for the parameters and the input, over a cached state."""
    ref, nat = _pair(family, 2, 16, 2, 8, 4, "float32", 5)
    rng = np.random.default_rng(6)
    x0, x1 = (mx.array(rng.standard_normal((1, t, 48)).astype(np.float32)) for t in (3, 2))

    def loss(model: nn.Module, x: mx.array) -> mx.array:
        cache = ArraysCache(2)
        model(x0, cache=cache)  # a state to start from
        return (model(x, cache=cache) ** 2).sum()

    grads = []
    for m in (ref, nat):
        got = nn.value_and_grad(m, loss)(m, x1)[1]
        dx = mx.grad(lambda x, m=m: loss(m, x))(x1)
        grads.append(dict(tree_flatten(got)) | {"x": dx})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        scale = float(mx.abs(g).max()) or 1.0
        assert float(mx.abs(grads[1][name] - g).max()) <= 1e-5 * scale, name
