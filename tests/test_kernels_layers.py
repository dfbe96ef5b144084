"""The native RMSNorm, RoPE, attention and MoE-block ops against MLX's, and how a model is switched.

RMSNorm and RoPE must equal `mx.fast.rms_norm` / `mx.fast.rope` bit for bit, and the
Qwen3-MoE block mlx-lm's block over the same expert kernel (the same arithmetic in the same
order: a model decodes the same tokens whichever runs, and the resident block equals the
streaming one); attention agrees with `mx.fast.scaled_dot_product_attention` within a
relative error of 1e-5 (its sums are reassociated). Gradients flow as MLX's.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge0.kernels import layers, native, ops

TOL = 1e-5


@pytest.fixture(autouse=True)
def _loaded() -> None:
    if native.module() is None:
        pytest.fail(f"the native kernels are not loaded: {native.status()}")


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> mx.array:
    return mx.array((rng.standard_normal(shape) * scale).astype(np.float32))


def _same(a: mx.array, b: mx.array) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(mx.array_equal(a, b).item())


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    d=st.sampled_from([1, 7, 64, 100, 256, 2048, 2880]),
    wdt=st.sampled_from(["float32", "bfloat16", "float16"]),
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
    scale=st.sampled_from([1e-3, 1.0, 40.0]),
    seed=st.integers(0, 2**16),
    transposed=st.booleans(),
)
def test_rms_norm_equals_mlx_bit_for_bit(
    rows: int, d: int, wdt: str, eps: float, scale: float, seed: int, transposed: bool
) -> None:
    rng = np.random.default_rng(seed)
    x = _normal(rng, (d, rows), scale).T if transposed else _normal(rng, (1, rows, d), scale)
    w = _normal(rng, (d,)).astype(getattr(mx, wdt))
    assert _same(ops.rms_norm(x, w, eps), mx.fast.rms_norm(x, w, eps))


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3),
    heads=st.integers(1, 5),
    t=st.integers(1, 9),
    d=st.sampled_from([8, 64, 80, 128, 256]),
    part=st.sampled_from([1.0, 0.5, 0.25]),
    traditional=st.booleans(),
    base=st.sampled_from([10000.0, 1e6, 500.0]),
    scale=st.sampled_from([1.0, 0.25]),
    offset=st.sampled_from([0, 1, 37, 4095, 131071]),
    three_d=st.booleans(),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rope_equals_mlx_bit_for_bit(
    b: int,
    heads: int,
    t: int,
    d: int,
    part: float,
    traditional: bool,
    base: float,
    scale: float,
    offset: int,
    three_d: bool,
    transposed: bool,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    dims = max(2, int(d * part) // 2 * 2)
    if three_d:
        x = _normal(rng, (b, t, d))
    elif transposed:  # as attention builds it: (B, L, H, D) viewed as (B, H, L, D)
        x = _normal(rng, (b, t, heads, d)).transpose(0, 2, 1, 3)
    else:
        x = _normal(rng, (b, heads, t, d))
    kw = {"traditional": traditional, "scale": scale}
    got = ops.rope(x, dims, base=base, offset=offset, **kw)
    assert _same(got, mx.fast.rope(x, dims, base=base, offset=offset, **kw))
    offs = mx.array(rng.integers(0, 5000, size=b), dtype=mx.int32)  # one per row (batch caches)
    got = ops.rope(x, dims, base=base, offset=offs, **kw)
    assert _same(got, mx.fast.rope(x, dims, base=base, offset=offs, **kw))
    freqs = mx.array(rng.uniform(1.0, 1e4, dims // 2).astype(np.float32))  # scaled ropes
    got = ops.rope(x, dims, base=None, offset=offset, freqs=freqs, **kw)
    assert _same(got, mx.fast.rope(x, dims, base=None, offset=offset, freqs=freqs, **kw))


def _qwen3_moe_args(**kw: object) -> object:
    from mlx_lm.models import qwen3_moe

    fields = dict(
        model_type="qwen3_moe",
        hidden_size=64,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=16,
        num_experts_per_tok=4,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        rms_norm_eps=1e-6,
        vocab_size=50,
        head_dim=16,
        rope_theta=1e4,
        tie_word_embeddings=True,
        max_position_embeddings=64,
        norm_topk_prob=True,
    )
    fields.update(kw)
    return qwen3_moe.ModelArgs(**fields)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 6),
    norm=st.booleans(),
    k=st.sampled_from([1, 2, 4, 8]),
    experts=st.sampled_from([8, 16, 32, 128]),
    bits=st.sampled_from([4, 8]),
    seed=st.integers(0, 2**16),
)
def test_moe_block_equals_mlx_lm_bit_for_bit(
    rows: int, norm: bool, k: int, experts: int, bits: int, seed: int
) -> None:
    from mlx_lm.models import qwen3_moe

    mx.random.seed(seed)
    block = qwen3_moe.Qwen3MoeSparseMoeBlock(
        _qwen3_moe_args(norm_topk_prob=norm, num_experts_per_tok=k, num_experts=experts)  # type: ignore[arg-type]
    )
    nn.quantize(block, group_size=32, bits=bits)
    mx.eval(block.parameters())
    x = _normal(np.random.default_rng(seed), (1, rows, 64))
    layers.use_native(block)
    ref = qwen3_moe.Qwen3MoeSparseMoeBlock.__call__(block, x)
    assert type(block) is layers.NativeQwen3MoeBlock
    got = block(x)  # ref ran mlx-lm's routing and sum around the same native expert kernel
    assert _same(got, ref)
    ramp = mx.arange(64).astype(mx.float32)
    g_got = mx.grad(lambda x: (block(x) * ramp).sum())(x)
    g_ref = mx.grad(lambda x: (qwen3_moe.Qwen3MoeSparseMoeBlock.__call__(block, x) * ramp).sum())(x)
    assert _rel(g_got, g_ref) <= 1e-4  # through the router's softmax as well


def _rel(got: mx.array, ref: mx.array) -> float:
    a, b = np.array(got, dtype=np.float64), np.array(ref, dtype=np.float64)
    assert a.shape == b.shape
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@settings(max_examples=50, deadline=None)
@given(
    b=st.integers(1, 2),
    kv=st.sampled_from([1, 2, 4]),
    rep=st.sampled_from([1, 2, 8]),
    lq=st.integers(1, 40),  # a decode step's queries and a prompt chunk's
    extra=st.integers(0, 300),
    d=st.sampled_from([16, 64, 80, 256]),
    causal=st.booleans(),
    cache_view=st.booleans(),
    sinks=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_attention_matches_mlx(
    b: int,
    kv: int,
    rep: int,
    lq: int,
    extra: int,
    d: int,
    causal: bool,
    cache_view: bool,
    sinks: bool,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    lk = lq + extra
    q = _normal(rng, (b, kv * rep, lq, d))
    full = lk + 16 if cache_view else lk  # a KV cache's filled part is a strided view
    k = _normal(rng, (b, kv, full, d))[:, :, :lk, :]
    v = _normal(rng, (b, kv, full, d), 3.0)[:, :, :lk, :]
    mask = "causal" if causal else None
    sink = _normal(rng, (kv * rep,), 2.0) if sinks else None  # gpt-oss: a logit per head
    got = ops.sdpa(q, k, v, scale=d**-0.5, mask=mask, sinks=sink)
    assert got is not None
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=d**-0.5, mask=mask, sinks=sink)
    assert _rel(got, ref) <= TOL


def test_sinks_take_their_share_of_the_weight() -> None:
    """A very large sink takes almost all the weight; a very small one none of it."""
    rng = np.random.default_rng(5)
    q, k, v = _normal(rng, (1, 2, 1, 16)), _normal(rng, (1, 2, 6, 16)), _normal(rng, (1, 2, 6, 16))
    plain = ops.sdpa(q, k, v, scale=0.25, mask=None)
    low = ops.sdpa(q, k, v, scale=0.25, mask=None, sinks=mx.array([-1e4, -1e4]))
    high = ops.sdpa(q, k, v, scale=0.25, mask=None, sinks=mx.array([1e4, 1e4]))
    assert plain is not None and low is not None and high is not None
    assert _same(low, plain)
    assert float(mx.abs(high).max()) < 1e-30
    sink = _normal(rng, (4,))  # a strided view is read in place, as its copy would be
    view = ops.sdpa(q, k, v, scale=0.25, mask=None, sinks=sink[::2])
    copy = ops.sdpa(q, k, v, scale=0.25, mask=None, sinks=mx.array(np.array(sink[::2])))
    assert view is not None and copy is not None and _same(view, copy)


def test_attention_leaves_what_it_does_not_run_to_mlx() -> None:
    rng = np.random.default_rng(0)
    q, k = _normal(rng, (1, 2, 9, 16)), _normal(rng, (1, 2, 9, 16))
    assert ops.sdpa(q, k, k, scale=0.25, mask="causal") is not None  # a prompt runs natively
    q1 = q[:, :, :1]
    assert ops.sdpa(q1, k, k, scale=0.25, mask=mx.zeros((1, 9))) is None  # an additive mask
    assert ops.sdpa(q1.astype(mx.float16), k, k, scale=0.25, mask=None) is None


def test_gradients_flow_as_mlx_computes_them() -> None:
    rng = np.random.default_rng(3)
    x, w = _normal(rng, (2, 4, 3, 64)), _normal(rng, (64,))
    ramp = mx.arange(64).astype(mx.float32)

    def rope_loss(f: Any) -> Any:
        return lambda x: (
            f(x, 64, traditional=False, base=1e4, scale=1.0, offset=3) ** 2 * ramp
        ).sum()

    assert _same(mx.grad(rope_loss(ops.rope))(x), mx.grad(rope_loss(mx.fast.rope))(x))
    got = mx.grad(lambda x, w: (ops.rms_norm(x, w, 1e-5) * ramp).sum(), argnums=(0, 1))(x, w)
    ref = mx.grad(lambda x, w: (mx.fast.rms_norm(x, w, 1e-5) * ramp).sum(), argnums=(0, 1))(x, w)
    assert _same(got[0], ref[0]) and _same(got[1], ref[1])
    q, kv = x[:, :, :1], _normal(rng, (2, 4, 7, 64))
    got_q = mx.grad(lambda q: (ops.sdpa(q, kv, kv, scale=0.125, mask=None) * ramp).sum())(q)  # type: ignore[operator]
    ref_q = mx.grad(
        lambda q: (mx.fast.scaled_dot_product_attention(q, kv, kv, scale=0.125) * ramp).sum()
    )(q)
    assert _rel(got_q, ref_q) <= TOL
    sink = _normal(rng, (4,))
    got_q = mx.grad(
        lambda q: (ops.sdpa(q, kv, kv, scale=0.125, mask=None, sinks=sink) * ramp).sum()  # type: ignore[operator]
    )(q)
    ref_q = mx.grad(
        lambda q: (
            mx.fast.scaled_dot_product_attention(q, kv, kv, scale=0.125, sinks=sink) * ramp
        ).sum()
    )(q)
    assert _rel(got_q, ref_q) <= TOL


def test_bad_operands_are_refused_at_graph_build() -> None:
    mod = native.module()
    assert mod is not None
    with pytest.raises(ValueError, match="weight must be 1-D"):
        mod.rms_norm(mx.zeros((2, 8)), mx.ones((4,)), 1e-5)
    with pytest.raises(ValueError, match="dims must be even"):
        mod.rope(mx.zeros((1, 1, 2, 8)), mx.array(0, mx.int32), None, 3, False, 1e4, 1.0)
    with pytest.raises(ValueError, match="offset must be int32"):
        mod.rope(mx.zeros((2, 1, 2, 8)), mx.zeros((3,), mx.int32), None, 8, False, 1e4, 1.0)
    with pytest.raises(ValueError, match="n_heads|do not match"):
        mod.sdpa(mx.zeros((1, 3, 1, 8)), mx.zeros((1, 2, 4, 8)), mx.zeros((1, 2, 4, 8)), 1.0, False)
    qkv = mx.zeros((1, 2, 1, 8))
    with pytest.raises(ValueError, match="one value per query head"):
        mod.sdpa(qkv, qkv, qkv, 1.0, False, None, mx.zeros((3,)))


def test_without_the_extension_mlx_ops_run(mlx_only: None) -> None:
    rng = np.random.default_rng(1)
    x = _normal(rng, (1, 2, 1, 16))
    assert ops.sdpa(x, x, x, scale=0.25, mask=None) is None
    w = mx.ones((16,))
    assert _same(ops.rms_norm(x, w, 1e-5), mx.fast.rms_norm(x, w, 1e-5))
    norm = nn.RMSNorm(16)
    layers.use_native(norm)
    y = norm(x)
    mx.eval(y)
    assert y.shape == x.shape  # the swapped layer runs MLX's op when the extension is off


def test_use_native_switches_norms_ropes_and_attention() -> None:
    from mlx_lm.models import base, qwen3_moe

    args = _qwen3_moe_args(
        hidden_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8
    )
    model = qwen3_moe.Model(args)  # type: ignore[arg-type]
    changed = layers.use_native(model)
    kinds = {type(m) for _, m in model.named_modules()}
    assert layers.NativeRMSNorm in kinds and layers.NativeRoPE in kinds and nn.RMSNorm not in kinds
    assert changed >= 6  # 2 layer norms, q/k norms, the final norm, the rope
    assert qwen3_moe.scaled_dot_product_attention is layers.native_attention
    assert base.scaled_dot_product_attention is not layers.native_attention  # the model's only


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 4),
    kv=st.sampled_from([1, 2]),
    rep=st.sampled_from([1, 4]),
    lens=st.lists(st.integers(1, 40), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_a_left_padded_row_attends_exactly_as_alone(
    rows: int, kv: int, rep: int, lens: list[int], seed: int
) -> None:
    """A batch's rows padded on the left to the longest (a boolean mask hides the padding)
    give bit for bit what each row gives alone, and agree with MLX's masked attention."""
    rng = np.random.default_rng(seed)
    lens = lens[:rows]
    width, d = max(lens), 32
    q = _normal(rng, (rows, kv * rep, 1, d))
    k, v = _normal(rng, (rows, kv, width, d)), _normal(rng, (rows, kv, width, d))
    keep = np.zeros((rows, 1, 1, width), dtype=bool)
    for r, n in enumerate(lens):
        keep[r, ..., width - n :] = True
    mask = mx.array(keep)
    got = ops.sdpa(q, k, v, scale=d**-0.5, mask=mask)
    assert got is not None
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=d**-0.5, mask=mask)
    assert _rel(got, ref) <= TOL
    for r, n in enumerate(lens):
        alone = ops.sdpa(
            q[r : r + 1],
            k[r : r + 1, :, width - n :],
            v[r : r + 1, :, width - n :],
            scale=d**-0.5,
            mask=None,
        )
        assert alone is not None and _same(got[r : r + 1], alone)
