"""The prerouter head modules: the trainable head and its lean untrained form (router copy)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


def multi_hot(indices: mx.array | None, num_experts: int, lead: tuple[int, ...]) -> mx.array:
    """(..., k) expert indices -> (..., E) float32 multi-hot; None -> zeros of shape lead + (E,)."""
    if indices is None:
        return mx.zeros((*lead, num_experts), dtype=mx.float32)
    onehots = indices[..., None] == mx.arange(num_experts)  # (..., k, E)
    return mx.any(onehots, axis=-2).astype(mx.float32)


class PrerouterHead(nn.Module):
    """head(x) = fc2(gelu_erf(fc1(x))) + l(x), x = [hidden, multi-hot(t), multi-hot(t-1)].

    `l` is split into `lin_h` (the hidden columns, initialised to the next router) and
    `lin_m` (the multi-hot columns, zeros), so the untrained head is bit-exactly the
    next layer's router applied to this layer's hidden.
    """

    def __init__(self, d_model: int, num_experts: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.num_experts = num_experts
        in_dim = d_model + 2 * num_experts
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, num_experts)
        self.lin_h = nn.Linear(d_model, num_experts, bias=bias)  # bias: the router's, if any
        self.lin_m = nn.Linear(2 * num_experts, num_experts, bias=False)
        self.fc2.weight = mx.zeros_like(self.fc2.weight)
        self.fc2.bias = mx.zeros_like(self.fc2.bias)
        self.lin_m.weight = mx.zeros_like(self.lin_m.weight)

    def __call__(self, hidden: mx.array, hot_t: mx.array, hot_prev: mx.array) -> mx.array:
        # hidden (..., d), hot_t / hot_prev (..., E) -> logits (..., E)
        return self.from_hots(hidden, mx.concatenate([hot_t, hot_prev], axis=-1))

    def from_hots(self, hidden: mx.array, hots: mx.array) -> mx.array:
        """The head on hidden (..., d) and both multi-hots concatenated, hots (..., 2E)."""
        x = mx.concatenate([hidden, hots], axis=-1)  # (..., d + 2E)
        mlp = self.fc2(nn.gelu(self.fc1(x)))  # nn.gelu is the erf form
        return self.lin_h(hidden) + self.lin_m(hots) + mlp


class RouterCopyHead(nn.Module):
    """An untrained head without its zero parts: `lin_h(hidden)` alone.

    An untrained `PrerouterHead` adds `lin_m(hots)` and `fc2(...)`, whose weights
    are zeros, so its logits equal `lin_h(hidden)`; this keeps the same logits
    without the (d + 2E) x hidden fc1 that never contributes (5 of the 8 MiB of a
    head on the 35B shape). For inference with the `init` predictor; training
    starts from full `PrerouterHead`s.
    """

    def __init__(self, d_model: int, num_experts: int, bias: bool = False) -> None:
        super().__init__()
        self.lin_h = nn.Linear(d_model, num_experts, bias=bias)

    def __call__(self, hidden: mx.array, hot_t: mx.array, hot_prev: mx.array) -> mx.array:
        return self.lin_h(hidden)
