"""OLMoE: softmax over all experts, top-k, renormalised only with norm_topk_prob (off in 1B-7B).

Experts are `mlp.experts.E.{gate,up,down}_proj.weight`; no shared expert.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention  # the native one once use_native ran

from edge0.families import tiny
from edge0.families.audit import (
    EXPERTS,
    HALVES,
    ROPE,
    TIED_OK,
    Fields,
    computed,
    derived_head_dim,
    edge0,
    only,
    where,
)
from edge0.families.base import Family
from edge0.families.probes import YARN


def _tiny(vocab: int) -> Any:
    from transformers import OlmoeConfig

    return OlmoeConfig(
        **tiny.common(vocab),
        intermediate_size=tiny.FF,
        num_key_value_heads=tiny.KV,
        num_experts=8,
        num_experts_per_tok=2,
    )


def _olmoe_1b_7b() -> Any:
    from transformers import OlmoeConfig

    return OlmoeConfig(
        vocab_size=50304,
        hidden_size=2048,
        intermediate_size=1024,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_experts=64,
        num_experts_per_tok=8,
        norm_topk_prob=False,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


class Olmoe(Family):
    name = "olmoe"
    model_types: ClassVar[dict[str, str]] = {"olmoe": "olmoe"}
    routing = "softmax, top-k (renormalised with norm_topk_prob)"

    fields: ClassVar[Fields] = {
        "num_experts": edge0(EXPERTS),
        "rope_parameters": ROPE,
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "clip_qkv": computed(
            "q, k (after their norms) and v clipped to +-clip_qkv (golden-tested)"
        ),
        "norm_topk_prob": computed("renormalise the top-k weights (golden-tested both ways)"),
        "tie_word_embeddings": computed(TIED_OK),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "OLMoE's q/k norms span hidden_size (transformers fails otherwise)",
        ),
        "mlp_bias": only(None, False, why="transformers' OLMoE experts have no biases"),
        "rope_traditional": edge0(HALVES),
    }

    flagships: ClassVar[dict[str, Any]] = {"olmoe-1b-7b": _olmoe_1b_7b}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "attention_bias": {"attention_bias": True},
        "clip_qkv": {"clip_qkv": 0.5},
        "head_dim": {"head_dim": 32},
        "tied": {"tie_word_embeddings": True},
        "norm_topk": {"norm_topk_prob": True},
        "gelu": {"hidden_act": "gelu"},
        "yarn_mscale": {"rope_parameters": dict(YARN, mscale=0.707)},
        "yarn_attention_factor": {"rope_parameters": dict(YARN, attention_factor=2.0)},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "attention_bias": True,
            "tie_word_embeddings": True,
            "norm_topk_prob": True,
            "rope_parameters": dict(YARN, mscale=0.707),  # mscale alone: transformers ignores it
            "clip_qkv": 0.5,
        },
    }

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """transformers clips q, k and v with `clip_qkv`; mlx-lm's attention never does."""
        if tc.get("clip_qkv") is not None:
            for layer in model.layers:
                attn: nn.Module = layer.self_attn
                attn.__class__ = _clipped_class(type(attn))
                object.__setattr__(attn, "clip", float(tc["clip_qkv"]))

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)


@functools.cache
def _clipped_class(cls: type) -> type:
    """mlx-lm's OLMoE attention with q, k (after their norms) and v clipped to +-clip."""

    def __call__(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        b, t, _ = x.shape

        def heads(y: mx.array, n: int) -> mx.array:
            return mx.clip(y, -self.clip, self.clip).reshape(b, t, n, -1).transpose(0, 2, 1, 3)

        q = heads(self.q_norm(self.q_proj(x)), self.n_heads)
        k = heads(self.k_norm(self.k_proj(x)), self.n_kv_heads)
        v = heads(self.v_proj(x), self.n_kv_heads)
        offset = cache.offset if cache is not None else 0
        q, k = self.rope(q, offset=offset), self.rope(k, offset=offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, t, -1))

    return type(f"Clipped{cls.__name__}", (cls,), {"__call__": __call__})
