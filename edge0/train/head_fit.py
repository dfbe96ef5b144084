"""One prerouter head's forward, backward and AdamW step in numpy (the training arithmetic).

The heads are a two-layer MLP plus a linear path (edge0.routing.prerouter_heads); their
loss is KL(teacher || head) plus a top-K set BCE (edge0.train.heads). Written out by hand
here because training is matrix products and nothing else, and numpy's BLAS runs them
6-50x faster than MLX's bundled reference BLAS on the Linux CPU (measured: docs/prerouter.md),
which made training the 35B shape's heads take hours. The weights go back into the MLX
heads that inference runs; tests/test_head_fit.py checks the gradients against MLX's own.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import mlx.core as mx
import numpy as np

from edge0.routing.prerouter_heads import PrerouterHead

NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "lin_h.weight", "lin_m.weight")
BIAS = "lin_h.bias"  # the router's bias, when the model's router has one
_SQRT_HALF = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


# Numerical Recipes' erfc: t exp(-z^2 + P(t)), t = 1 / (1 + z/2), P's coefficients from t^0 up
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
         -1.13520398, 1.48851587, -0.82215223, 0.17087277)  # fmt: skip


def erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.2e-7 (numpy has none)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    acc = np.full_like(t, _ERFC[-1])
    for c in reversed(_ERFC[:-1]):
        acc = c + t * acc
    out: np.ndarray = np.sign(x) * (1.0 - t * np.exp(-z * z + acc))
    return out


@attrs.define
class HeadParams:
    """One head's weights (MLX's layout: Linear weights are (out, in)) and Adam's moments."""

    w: dict[str, np.ndarray]
    m: dict[str, np.ndarray] = attrs.field(factory=dict)
    v: dict[str, np.ndarray] = attrs.field(factory=dict)

    @classmethod
    def of(cls, head: PrerouterHead) -> HeadParams:
        names = [*NAMES, BIAS] if "bias" in head.lin_h else list(NAMES)
        flat = dict(_flat(head.parameters()))
        return cls({n: np.array(flat[n], dtype=np.float32) for n in names})

    def copy(self) -> dict[str, np.ndarray]:
        return {n: a.copy() for n, a in self.w.items()}

    def load_into(self, head: PrerouterHead, weights: dict[str, np.ndarray]) -> None:
        head.load_weights([(n, mx.array(a)) for n, a in weights.items()], strict=False)


def _flat(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, dict):
        return [kv for k, v in tree.items() for kv in _flat(v, f"{prefix}{k}.")]
    return [(prefix[:-1], tree)]


def multi_hot(indices: np.ndarray, num_experts: int) -> np.ndarray:
    """(R, k) expert indices (-1: none) -> (R, E) float32 multi-hot."""
    out = np.zeros((len(indices), num_experts), dtype=np.float32)
    rows = np.repeat(np.arange(len(indices)), indices.shape[1])
    cols = indices.reshape(-1)
    keep = cols >= 0
    out[rows[keep], cols[keep]] = 1.0
    return out


def top_hot(logits: np.ndarray, k: int) -> np.ndarray:
    """(R, E) -> (R, E) multi-hot of each row's k largest entries."""
    return multi_hot(np.argpartition(-logits, k - 1, axis=-1)[:, :k], logits.shape[-1])


@attrs.frozen
class Rows:
    """A head's inputs and target for R rows: hidden (R, d), hots (R, 2E), target (R, E)."""

    hidden: np.ndarray
    hots: np.ndarray
    target: np.ndarray

    @property
    def x(self) -> np.ndarray:
        return np.concatenate([self.hidden, self.hots], axis=1)


def forward(p: dict[str, np.ndarray], rows: Rows) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The head's logits (R, E), and what the backward pass needs."""
    x = rows.x
    u = x @ p["fc1.weight"].T + p["fc1.bias"]  # (R, H)
    cdf = 0.5 * (1.0 + erf(u * _SQRT_HALF))
    a = u * cdf  # gelu, the erf form
    z = a @ p["fc2.weight"].T + p["fc2.bias"]
    z += rows.hidden @ p["lin_h.weight"].T + rows.hots @ p["lin_m.weight"].T
    if BIAS in p:
        z += p[BIAS]
    return z, {"x": x, "u": u, "cdf": cdf, "a": a}


def loss_and_grad(
    p: dict[str, np.ndarray], rows: Rows, k: int, set_weight: float
) -> tuple[float, dict[str, np.ndarray]]:
    """Row mean of KL(softmax(target) || softmax(z)) + set_weight * BCE(top-k set) / k, and
    its gradients with respect to every weight."""
    z, saved = forward(p, rows)
    loss, dz = objective(z, rows.target, k, set_weight)
    da = dz @ p["fc2.weight"]
    u = saved["u"]
    du = da * (saved["cdf"] + u * np.exp(-0.5 * u * u) * _INV_SQRT_2PI)
    grads = {
        "fc2.weight": dz.T @ saved["a"],
        "fc2.bias": dz.sum(axis=0),
        "fc1.weight": du.T @ saved["x"],
        "fc1.bias": du.sum(axis=0),
        "lin_h.weight": dz.T @ rows.hidden,
        "lin_m.weight": dz.T @ rows.hots,
    }
    if BIAS in p:
        grads[BIAS] = dz.sum(axis=0)
    return loss, grads


def objective(z: np.ndarray, target: np.ndarray, k: int, w: float) -> tuple[float, np.ndarray]:
    """The loss of logits `z` against `target` (row mean), and its gradient in `z`."""
    logp = target - _lse(target)
    logq = z - _lse(z)
    p = np.exp(logp)
    y = top_hot(target, k)
    kl = np.sum(p * (logp - logq), axis=-1)
    bce = np.sum(np.logaddexp(0.0, z) - y * z, axis=-1) / k
    n = len(z)
    sig = 0.5 * (1.0 + np.tanh(0.5 * z))  # sigmoid without overflow
    dz = ((np.exp(logq) - p) + w * (sig - y) / k) / n
    return float(np.mean(kl + w * bce)), dz.astype(np.float32)


def _lse(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    out: np.ndarray = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))
    return out


def recall(z: np.ndarray, target: np.ndarray, k: int) -> float:
    """Mean |top-k(z) ∩ top-k(target)| / k."""
    return float(np.mean(np.sum(top_hot(z, k) * top_hot(target, k), axis=-1) / k))


def adamw(
    params: HeadParams,
    grads: dict[str, np.ndarray],
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> None:
    """mlx.optimizers.AdamW's update (decoupled decay, no bias correction), in place."""
    b1, b2 = betas
    for name, g in grads.items():
        w = params.w[name]
        m = params.m.setdefault(name, np.zeros_like(w))
        v = params.v.setdefault(name, np.zeros_like(w))
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * g * g
        w *= 1 - lr * weight_decay
        w -= lr * m / (np.sqrt(v) + eps)
