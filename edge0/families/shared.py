"""Router rules, block parts and layer rules that several families share."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from edge0.families.base import Family
from edge0.model import attention


class LogitsTopK(Family):
    """Top-k of the router logits (mlx-lm's op order), softmax over the k (gpt-oss, Granite)."""

    routing = "top-k of logits, softmax over the k"

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return self.router_logits(block, x)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        inds = mx.argpartition(scores, kth=-k, axis=-1)[..., -k:]  # mlx-lm's order
        return inds, self.weights(block, scores, inds)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        return mx.softmax(mx.take_along_axis(scores, inds, axis=-1), axis=-1, precise=True)


def slide(model: nn.Module, windows: list[int | None]) -> None:
    """Give each decoder layer's `self_attn` its window and the model caches that keep it,
    where any layer slides (edge0.model.attention.windowed)."""
    if any(windows):
        attention.windowed(model, windows, [layer.self_attn for layer in model.layers])


def sigmoid_gated_shared(block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
    """y + sigmoid(shared_expert_gate(x)) * shared_expert(x) (Qwen2-MoE, Qwen3-Next/3.5)."""
    if "shared_expert" in block:
        return y + mx.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    return y


def every_layer_sparse_unless(tc: dict[str, Any]) -> list[int]:
    """Qwen rule: sparse unless in mlp_only_layers, and (i + 1) % decoder_sparse_step == 0."""
    only = set(tc.get("mlp_only_layers") or [])
    step = int(tc.get("decoder_sparse_step") or 1)
    n = int(tc["num_hidden_layers"])
    return [i for i in range(n) if i not in only and (i + 1) % step == 0]


def dense_first_then_sparse(tc: dict[str, Any]) -> list[int]:
    """DeepSeek rule: dense below first_k_dense_replace, then sparse every moe_layer_freq."""
    first = int(tc.get("first_k_dense_replace") or 0)
    freq = int(tc.get("moe_layer_freq") or 1)
    return [i for i in range(int(tc["num_hidden_layers"])) if i >= first and i % freq == 0]
