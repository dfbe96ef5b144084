"""DeepSeek-V3 / Kimi-K2 / Moonlight: sigmoid scores, correction bias, group-limited top-k.

Selection ranks sigmoid(logits) + e_score_correction_bias within the best
`topk_group` of `n_group` groups (a group scores by its top two); gate weights are
the plain sigmoid scores of the set, renormalised with norm_topk_prob, times
routed_scaling_factor. Shared experts are added ungated. The first
`first_k_dense_replace` layers (and layers off `moe_layer_freq`) are dense.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families import tiny
from edge0.families.audit import ROPE, TIED_OK, Fields, computed, edge0, irrelevant
from edge0.families.base import Family
from edge0.families.deepseek_v2 import MLA
from edge0.families.probes import LLAMA3, YARN
from edge0.families.shared import dense_first_then_sparse

MTP = "multi-token-prediction layers: transformers does not run them, Edge0 drops them"
# the DeepSeek-V3 router's rows (glm4_moe shares them)
V3_ROUTER: Fields = {
    "norm_topk_prob": computed("renormalise the top-k sigmoid weights (golden-tested both)"),
    "topk_method": edge0("transformers ignores it (always noaux_tc); Edge0 tells mlx-lm so"),
    "scoring_func": edge0("transformers ignores it (always sigmoid); Edge0 tells mlx-lm so"),
}


def _tiny(vocab: int, **changes: Any) -> Any:
    from transformers import DeepseekV3Config

    fields: dict[str, Any] = dict(
        intermediate_size=2 * tiny.FF,
        moe_intermediate_size=tiny.FF,
        num_key_value_heads=tiny.HEADS,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
    )
    return DeepseekV3Config(**tiny.common(vocab), **(fields | changes))


def _kimi_tiny(vocab: int) -> Any:
    """Kimi-K2: one group, scaled 2.827."""
    return _tiny(vocab, n_group=1, routed_scaling_factor=2.827)


def _flagship(**changes: Any) -> Any:
    from transformers import DeepseekV3Config

    fields: dict[str, Any] = dict(
        vocab_size=163840,
        num_key_value_heads=16,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        dtype="bfloat16",
    )
    return DeepseekV3Config(**(fields | changes))


def _moonlight_16b_a3b() -> Any:
    return _flagship(
        hidden_size=2048,
        intermediate_size=11264,
        moe_intermediate_size=1408,
        num_hidden_layers=27,
        num_attention_heads=16,
        n_routed_experts=64,
        n_shared_experts=2,
        num_experts_per_tok=6,
        q_lora_rank=None,
        routed_scaling_factor=2.446,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
    )


def _kimi_k2() -> Any:
    return _flagship(
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=61,
        num_attention_heads=64,
        num_key_value_heads=64,
        n_routed_experts=384,
        n_shared_experts=1,
        num_experts_per_tok=8,
        q_lora_rank=1536,
        routed_scaling_factor=2.827,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 50000.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    )


class DeepseekV3(Family):
    name = "deepseek_v3"
    model_types: ClassVar[dict[str, str]] = {"deepseek_v3": "deepseek_v3"}
    expert_keys = ("n_routed_experts",)
    routing = "sigmoid + correction bias, group-limited top-k, renormalised, scaled"
    shared = "ungated (n_shared_experts)"
    rope_in_attention = True  # YaRN's mscale_all_dim scales its softmax too

    fields: ClassVar[Fields] = {
        **MLA,
        **V3_ROUTER,
        "rope_parameters": ROPE,
        "rope_interleave": computed(
            "rotate interleaved pairs (true) or halves (golden-tested both)"
        ),
        "num_nextn_predict_layers": irrelevant(MTP),
        "tie_word_embeddings": computed(TIED_OK),
    }

    flagships: ClassVar[dict[str, Any]] = {"moonlight-16b-a3b": _moonlight_16b_a3b}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "no_interleave": {"rope_interleave": False},
        "yarn_mscale": {"rope_parameters": dict(YARN, mscale=1.0, mscale_all_dim=1.0)},
        "attention_bias": {"attention_bias": True},
        "no_q_lora": {"q_lora_rank": None},
        "no_norm_topk": {"norm_topk_prob": False},
        "tied": {"tie_word_embeddings": True},
        "gelu": {"hidden_act": "gelu"},
        "top1_norm": {"num_experts_per_tok": 1, "norm_topk_prob": True},
        "yarn_mscale_only": {"rope_parameters": dict(YARN, mscale=0.707)},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "rope_parameters": dict(LLAMA3),
            "q_lora_rank": None,
            "attention_bias": True,
            "norm_topk_prob": False,
            "rope_interleave": False,
            "tie_word_embeddings": True,
        },
        # top-1 renormalised to 1, YaRN's mscale without mscale_all_dim (transformers: ignored)
        "top1": {
            "num_experts_per_tok": 1,
            "norm_topk_prob": True,
            "rope_parameters": dict(YARN, mscale=0.707),
        },
    }

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        # transformers always routes noaux_tc over sigmoids whatever these (mlx-lm's) keys say
        tc["topk_method"], tc["scoring_func"] = "noaux_tc", "sigmoid"
        tc["moe_layer_freq"] = 1  # transformers makes every layer from first_k_dense_replace sparse
        return tc

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        return dense_first_then_sparse(tc)

    def kv_token_bytes(self, tc: dict[str, Any], itemsize: int) -> int:
        """mlx-lm's deepseek_v3 caches the latent (kv_lora_rank) and the rotated key part,
        once for all heads."""
        return (int(tc["kv_lora_rank"]) + int(tc["qk_rope_head_dim"])) * itemsize

    def interleaved_rope(self, tc: dict[str, Any]) -> bool | None:
        return bool(tc.get("rope_interleave", True))  # mlx-lm: interleaved always

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """A plain rope over halves (`rope_interleave: false`), which mlx-lm never builds, and
        a single expert's weight renormalised (to 1) with norm_topk_prob, as transformers
        does and mlx-lm's gate skips."""
        for i, layer in enumerate(model.layers):
            if not self.interleaved_rope(tc) and "rope" in layer.self_attn:
                layer.self_attn.rope.traditional = False
            if i in self.sparse_layers(tc) and tc.get("norm_topk_prob"):
                gate: nn.Module = layer.mlp.gate
                gate.__class__ = _one_renormalised_class(type(gate))

    def router_logits(self, block: nn.Module, x: mx.array) -> mx.array:
        out: mx.array = x @ block.gate.weight.T
        return out

    def scores(self, block: nn.Module, x: mx.array) -> mx.array:
        return self.router_logits(block, x)

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        from mlx_lm.models.deepseek_v3 import group_expert_select

        g = block.gate
        inds, w = group_expert_select(
            scores,
            g.e_score_correction_bias,
            k,
            g.n_group,
            g.topk_group,
            g.routed_scaling_factor,
            g.norm_topk_prob,
        )
        if k == 1 and g.norm_topk_prob:  # renormalised: the weight is 1 (mlx-lm skips it)
            w = mx.full(w.shape, g.routed_scaling_factor, dtype=w.dtype)
        return inds, w

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        g = block.gate
        w = mx.take_along_axis(mx.sigmoid(scores.astype(mx.float32)), inds, axis=-1)
        if g.norm_topk_prob:
            w = w / w.sum(axis=-1, keepdims=True)
        return w * g.routed_scaling_factor

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        y = y.astype(x.dtype)  # the block sums fp32 gate weights, then casts back
        if "shared_experts" in block:
            return y + block.shared_experts(x)
        return y


class KimiK2(DeepseekV3):
    """Kimi-K2: DeepSeek-V3's architecture under its own model_type (mlx-lm remaps it)."""

    name = "kimi_k2"
    model_types: ClassVar[dict[str, str]] = {"kimi_k2": "deepseek_v3"}
    config_types: ClassVar[dict[str, str]] = {"kimi_k2": "deepseek_v3"}

    tiny = staticmethod(_kimi_tiny)
    flagships: ClassVar[dict[str, Any]] = {"kimi-k2": _kimi_k2}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "rope_yarn": {"rope_parameters": dict(YARN, mscale=1.0, mscale_all_dim=1.0)},
    }
    # Kimi-K2's own rope (YaRN with both mscales), on its one-group router
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "yarn": {"rope_parameters": dict(YARN, mscale=1.0, mscale_all_dim=1.0)},
    }


@functools.cache
def _one_renormalised_class(cls: type) -> type:
    """mlx-lm's DeepSeek-V3 / GLM-4.5 gate renormalising a single expert's weight (to 1)."""

    def __call__(self: Any, x: mx.array) -> tuple[mx.array, mx.array]:
        inds, w = cls.__call__(self, x)
        if self.top_k == 1 and self.norm_topk_prob:
            w = mx.full(w.shape, self.routed_scaling_factor, dtype=w.dtype)
        return inds, w

    return type(f"Renormalised{cls.__name__}", (cls,), {"__call__": __call__})
