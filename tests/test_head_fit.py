"""The numpy head training arithmetic against MLX's: forward, loss, gradients, AdamW."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

from edge0.routing.prerouter_heads import PrerouterHead
from edge0.routing.prerouter_heads import multi_hot as mx_multi_hot
from edge0.train import head_fit as hf


def mlx_loss(z: mx.array, target: mx.array, k: int, w: float) -> mx.array:
    """The heads' objective written in MLX: KL(softmax(target) || softmax(z)) + BCE / k."""
    logp = target - mx.logsumexp(target, axis=-1, keepdims=True)
    logq = z - mx.logsumexp(z, axis=-1, keepdims=True)
    kl = mx.sum(mx.exp(logp) * (logp - logq), axis=-1)
    inds = mx.argpartition(-target, kth=k - 1, axis=-1)[..., :k]
    y = mx_multi_hot(inds, target.shape[-1], tuple(target.shape[:-1]))
    return mx.mean(kl + w * mx.sum(nn.softplus(z) - y * z, axis=-1) / k)


def setup(bias: bool, seed: int = 0) -> tuple[PrerouterHead, hf.Rows, list[int], list[int]]:
    d, e, hidden, rows, k = 24, 12, 16, 64, 3
    rng = np.random.default_rng(seed)
    mx.random.seed(seed)
    head = PrerouterHead(d, e, hidden, bias)
    flat = tree_flatten(head.parameters())
    # every weight random (an untrained head has fc2 and lin_m at zero)
    head.load_weights([(n, 0.3 * mx.random.normal(v.shape)) for n, v in flat])
    t = rng.integers(0, e, (rows, k))
    p = rng.integers(-1, e, (rows, k))
    hots = np.concatenate([hf.multi_hot(t, e), hf.multi_hot(p, e)], axis=1)
    target = rng.normal(size=(rows, e)).astype(np.float32) * 3
    hidden_x = rng.normal(size=(rows, d)).astype(np.float32)
    return head, hf.Rows(hidden_x, hots, target), t.tolist(), p.tolist()


def test_multi_hot_matches_mlx() -> None:
    rng = np.random.default_rng(1)
    idx = rng.integers(-1, 10, (50, 4))
    want = np.array(mx_multi_hot(mx.array(idx), 10, (50,)))
    assert np.array_equal(hf.multi_hot(idx, 10), want)


def test_erf_matches_math() -> None:
    x = np.linspace(-7, 7, 2001)
    assert np.max(np.abs(hf.erf(x) - np.array([math.erf(v) for v in x]))) < 2e-7


@pytest.mark.parametrize("bias", [False, True])
def test_forward_loss_and_gradients_match_mlx(bias: bool) -> None:
    head, rows, _, _ = setup(bias)
    k, w = 3, 0.5
    p = hf.HeadParams.of(head)
    e = rows.target.shape[1]
    hot_t, hot_p = mx.array(rows.hots[:, :e]), mx.array(rows.hots[:, e:])
    x = mx.array(rows.hidden)
    z_mx = head(x, hot_t, hot_p)
    z_np, _ = hf.forward(p.w, rows)
    np.testing.assert_allclose(z_np, np.array(z_mx), rtol=0, atol=2e-5)

    def loss_fn(model: PrerouterHead) -> mx.array:
        return mlx_loss(model(x, hot_t, hot_p), mx.array(rows.target), k, w)

    value, grads = nn.value_and_grad(head, loss_fn)(head)
    got, got_grads = hf.loss_and_grad(p.w, rows, k, w)
    assert got == pytest.approx(float(value), rel=1e-5)
    want = dict(tree_flatten(grads))
    assert set(got_grads) == set(want)
    for name, g in got_grads.items():
        ref = np.array(want[name])
        scale = max(1e-6, float(np.max(np.abs(ref))))
        assert np.max(np.abs(g - ref)) / scale < 1e-4, name


def test_adamw_matches_mlx() -> None:
    head, rows, _, _ = setup(False, seed=3)
    p = hf.HeadParams.of(head)
    e = rows.target.shape[1]
    hot_t, hot_p = mx.array(rows.hots[:, :e]), mx.array(rows.hots[:, e:])
    x, target = mx.array(rows.hidden), mx.array(rows.target)
    opt = optim.AdamW(learning_rate=2e-3, weight_decay=0.1)
    step = nn.value_and_grad(head, lambda m: mlx_loss(m(x, hot_t, hot_p), target, 3, 0.5))
    for _ in range(3):
        _, grads = step(head)
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state)
        _, g = hf.loss_and_grad(p.w, rows, 3, 0.5)
        hf.adamw(p, g, 2e-3, 0.1)
    for name, ref in tree_flatten(head.parameters()):
        np.testing.assert_allclose(p.w[name], np.array(ref), rtol=0, atol=2e-5, err_msg=name)
