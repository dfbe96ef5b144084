"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): softmax, top-k, plus a sigmoid-gated shared expert.

mlx-lm's qwen2_moe makes every layer sparse, never renormalises the top-k, always has q/k/v
biases, its own head and hidden_size // heads, and no sliding window; `adapt` adds what
transformers computes there (dense layers of the Qwen rule, `norm_topk_prob`, `qkv_bias`,
a tied head, an explicit head_dim, sliding layers of `layer_types`).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families import tiny
from edge0.families.audit import (
    HALVES,
    ROPE,
    SHAPE,
    TIED_OK,
    Fields,
    computed,
    edge0,
    where,
)
from edge0.families.base import Family
from edge0.families.probes import YARN
from edge0.families.shared import every_layer_sparse_unless, sigmoid_gated_shared, slide
from edge0.model import attention

# transformers' layer_types of 3 layers with use_sliding_window (every other layer slides)
SLIDING_ODD = ("sliding_attention", "full_attention", "sliding_attention")
LAYERS = "the Qwen rule: a layer is sparse unless listed, and (i + 1) % step == 0"


def _tiny(vocab: int) -> Any:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **tiny.common(vocab),
        intermediate_size=2 * tiny.FF,
        num_key_value_heads=tiny.KV,
        moe_intermediate_size=tiny.FF,
        shared_expert_intermediate_size=tiny.FF,
        num_experts=8,
        num_experts_per_tok=2,
    )


def _qwen15_moe_a27b() -> Any:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=5632,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_experts=60,
        num_experts_per_tok=4,
        norm_topk_prob=False,
        max_position_embeddings=8192,
        dtype="bfloat16",
    )


def _windowed(value: Any, cfg: dict[str, Any]) -> bool:
    return "sliding_attention" not in (value or []) or bool(cfg.get("sliding_window"))


def _dense(d: int, ff: int) -> nn.Module:
    """transformers' Qwen2-MoE MLP of a layer that is not sparse (mlx-lm's MLP class)."""
    from mlx_lm.models.qwen2_moe import MLP

    return MLP(d, ff)


@functools.cache
def _renormalised_class(cls: type) -> type:
    """mlx-lm's Qwen2-MoE block with the top-k weights renormalised (`norm_topk_prob`)."""

    def __call__(self: Any, x: mx.array) -> mx.array:
        gates = mx.softmax(self.gate(x), axis=-1, precise=True)
        k = self.top_k
        inds = mx.stop_gradient(mx.argpartition(-gates, kth=k - 1, axis=-1)[..., :k])
        w = mx.take_along_axis(gates, inds, axis=-1)
        w = w / mx.sum(w, axis=-1, keepdims=True)
        y = (self.switch_mlp(x, inds) * w[..., None]).sum(axis=-2)
        return y + mx.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    return type(f"Renormalised{cls.__name__}", (cls,), {"__call__": __call__})


class Qwen2Moe(Family):
    name = "qwen2_moe"
    model_types: ClassVar[dict[str, str]] = {"qwen2_moe": "qwen2_moe"}
    routing = "softmax, top-k (renormalised with norm_topk_prob)"
    shared = "sigmoid-gated"

    fields: ClassVar[Fields] = {
        "decoder_sparse_step": edge0(LAYERS + " (golden-tested at 2)"),
        "mlp_only_layers": edge0(LAYERS + "; the others a dense MLP of intermediate_size"),
        "norm_topk_prob": computed("renormalise the top-k weights (golden-tested both ways)"),
        "qkv_bias": computed("q/k/v biases, on or off (golden-tested off)"),
        "moe_intermediate_size": computed(SHAPE + " (experts)"),
        "shared_expert_intermediate_size": computed(SHAPE + " (sigmoid-gated shared expert)"),
        "num_experts": edge0("routed experts per sparse layer (the expert records)"),
        "rope_parameters": ROPE,
        "head_dim": computed(
            "q/k/v/o sized by it, hidden_size // heads when absent (golden-tested)"
        ),
        "tie_word_embeddings": computed(TIED_OK),
        "use_sliding_window": edge0("switches sliding windows on (transformers' layer_types rule)"),
        "max_window_layers": edge0("which layers slide (transformers' layer_types rule)"),
        "sliding_window": computed("the window of sliding_attention layers (golden-tested at 4)"),
        "layer_types": where(
            _windowed,
            "sliding_attention only with use_sliding_window (a window above 0)",
            "each layer's attention: a sliding_attention layer attends over its last "
            "sliding_window tokens and its KV cache keeps them (golden-tested); transformers' "
            "window is 0 without use_sliding_window, which masks every key",
        ),
        "rope_traditional": edge0(HALVES),
    }

    flagships: ClassVar[dict[str, Any]] = {"qwen1.5-moe-a2.7b": _qwen15_moe_a27b}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "no_qkv_bias": {"qkv_bias": False},
        "sliding_window": {
            "use_sliding_window": True,
            "sliding_window": 4,
            "layer_types": list(SLIDING_ODD),
        },
        "head_dim": {"head_dim": 32},
        "tied": {"tie_word_embeddings": True},
        "gelu": {"hidden_act": "gelu"},
        "norm_topk": {"norm_topk_prob": True},
        "sparse_step": {"decoder_sparse_step": 2},
        "mlp_only": {"mlp_only_layers": [0]},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "qkv_bias": False,
            "tie_word_embeddings": True,
            "norm_topk_prob": True,
            "decoder_sparse_step": 2,
            "use_sliding_window": True,
            "sliding_window": 4,
            "layer_types": list(SLIDING_ODD),
            "rope_parameters": dict(YARN),
        },
        # an activation with weights of its own: shared expert and experts, one each per layer
        "prelu": {"hidden_act": "prelu"},
    }
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        (
            {"layer_types": ["sliding_attention", "full_attention", "full_attention"]},
            'layer_types=["sliding_attention"',
        ),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        return every_layer_sparse_unless(tc)

    def prepare_hf(self, weights: dict[str, mx.array], tc: dict[str, Any]) -> dict[str, mx.array]:
        """Per-expert tensors stacked for every sparse layer (mlx-lm's sanitize stacks them only
        when layer 0 is sparse)."""
        for layer in self.sparse_layers(tc):
            pre = f"model.layers.{layer}.mlp"
            for proj in ("gate_proj", "up_proj", "down_proj"):
                for part in ("weight", "scales", "biases"):
                    names = [f"{pre}.experts.{e}.{proj}.{part}" for e in range(tc["num_experts"])]
                    if names[0] in weights:
                        stacked = mx.stack([weights.pop(n) for n in names])
                        weights[f"{pre}.switch_mlp.{proj}.{part}"] = stacked
        return weights

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """What transformers' Qwen2-MoE computes and mlx-lm's lacks: q/k/v biases off, an
        explicit head_dim, dense layers, the top-k renormalised, sliding layers (a tied head:
        edge0.model.arch, for every family)."""
        d, heads, kv = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"]
        head_dim = int(tc.get("head_dim") or d // heads)
        sparse = set(self.sparse_layers(tc))
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            if head_dim != d // heads:
                attention.resize_heads(attn, head_dim, heads, kv)
            if not tc.get("qkv_bias", True):
                attention.projections(attn, dict.fromkeys(("q_proj", "k_proj", "v_proj"), False))
            if i not in sparse:
                layer.mlp = _dense(d, int(tc["intermediate_size"]))
            elif tc.get("norm_topk_prob"):
                block: nn.Module = layer.mlp
                block.__class__ = _renormalised_class(type(block))
                object.__setattr__(block, "norm_topk_prob", True)
        slide(model, self.windows(tc))

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        return sigmoid_gated_shared(block, x, y)
