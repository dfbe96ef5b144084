"""DeepSeek-V3 / Kimi-K2 / Moonlight: sigmoid scores, correction bias, group-limited top-k.

Selection ranks sigmoid(logits) + e_score_correction_bias within the best
`topk_group` of `n_group` groups (a group scores by its top two); gate weights are
the plain sigmoid scores of the set, renormalised with norm_topk_prob, times
routed_scaling_factor. Shared experts are added ungated. The first
`first_k_dense_replace` layers (and layers off `moe_layer_freq`) are dense.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families import tiny
from edge0.families.audit import Fields, Rope, computed, edge0, irrelevant, only
from edge0.families.base import Family, dense_first_then_sparse
from edge0.families.deepseek_v2 import MLA, TIED
from edge0.families.probes import LLAMA3, YARN

ALL_ROPES = ("default", "linear", "dynamic", "yarn", "llama3")
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

    fields: ClassVar[Fields] = {
        **MLA,
        **V3_ROUTER,
        "rope_parameters": Rope(ALL_ROPES, "mlx-lm's deepseek_v3 builds these rope types only"),
        "rope_interleave": only(True, why="mlx-lm's deepseek_v3 rotates interleaved pairs only"),
        "num_nextn_predict_layers": irrelevant(MTP),
        "tie_word_embeddings": only(False, why=TIED.format("deepseek_v3")),
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
    }
    variant: ClassVar[dict[str, Any]] = {
        "rope_parameters": dict(LLAMA3),
        "q_lora_rank": None,
        "attention_bias": True,
        "norm_topk_prob": False,
    }
    refusals: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"rope_interleave": False}, "rope_interleave=false: mlx-lm's deepseek_v3"),
        ({"moe_layer_freq": 2}, "moe_layer_freq=2: transformers makes every layer"),
    ]

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        # transformers always routes noaux_tc over sigmoids whatever these (mlx-lm's) keys say
        tc["topk_method"], tc["scoring_func"] = "noaux_tc", "sigmoid"
        return tc

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        return dense_first_then_sparse(tc)

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
        return inds, w

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        g = block.gate
        w = mx.take_along_axis(mx.sigmoid(scores.astype(mx.float32)), inds, axis=-1)
        if inds.shape[-1] > 1 and g.norm_topk_prob:
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
