"""GLM-4.5 / 4.6 (glm4_moe): DeepSeek-V3 routing (sigmoid, bias, groups), standard attention.

The first `first_k_dense_replace` layers are dense; shared experts are added
ungated; experts are `mlp.experts.E.{gate,up,down}_proj.weight`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from edge0.families import tiny
from edge0.families.audit import ROPE_PARTIAL, TIED_OK, Fields, computed, irrelevant
from edge0.families.base import Family
from edge0.families.deepseek_v2 import MLA
from edge0.families.deepseek_v3 import MTP, V3_ROUTER, DeepseekV3
from edge0.families.probes import YARN, longrope

MOE_ROWS = (
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "first_k_dense_replace",
)
FULL_ROTARY = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}


def _tiny(vocab: int) -> Any:
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        **tiny.common(vocab),
        intermediate_size=2 * tiny.FF,
        moe_intermediate_size=tiny.FF,  # type: ignore[call-arg]
        num_key_value_heads=tiny.KV,
        head_dim=tiny.HEAD_DIM,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.5,
    )


def _glm45_air(layers: int = 46) -> Any:
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        vocab_size=151552,
        hidden_size=4096,
        intermediate_size=10944,  # type: ignore[call-arg]
        moe_intermediate_size=1408,
        num_hidden_layers=layers,
        num_attention_heads=96,
        num_key_value_heads=8,
        head_dim=128,
        n_routed_experts=128,
        n_shared_experts=1,
        num_experts_per_tok=8,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
        norm_topk_prob=True,
        attention_bias=True,
        use_qk_norm=False,
        max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        dtype="bfloat16",
    )


class Glm4Moe(DeepseekV3):
    name = "glm4_moe"
    model_types: ClassVar[dict[str, str]] = {"glm4_moe": "glm4_moe"}
    rope_in_attention = False

    fields: ClassVar[Fields] = {
        **{k: MLA[k] for k in MOE_ROWS},
        **V3_ROUTER,
        "rope_parameters": ROPE_PARTIAL,
        "attention_bias": computed("q/k/v biases (golden-tested)"),
        "use_qk_norm": computed("RMSNorm of q and k per head (golden-tested)"),
        "head_dim": computed("mlx-lm takes it (transformers: hidden_size // heads when absent)"),
        "num_nextn_predict_layers": irrelevant(MTP),
        "tie_word_embeddings": computed(TIED_OK),
    }

    flagships: ClassVar[dict[str, Any]] = {
        "glm-4.5-air": _glm45_air,
        # a stated layer cut: full width, 6 of the 46 layers (5 sparse); fits this machine's
        # disk (the full one: 56 GiB)
        "glm-4.5-air-6layers": lambda: _glm45_air(6),
    }
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "attention_bias": {"attention_bias": True},
        "qk_norm": {"use_qk_norm": True},
        "partial_rotary": {"rope_parameters": dict(FULL_ROTARY)},
        "no_norm_topk": {"norm_topk_prob": False},
        "tied": {"tie_word_embeddings": True},
        "gelu": {"hidden_act": "gelu"},
        "top1_norm": {"num_experts_per_tok": 1, "norm_topk_prob": True},
        "rope-longrope": {"rope_parameters": longrope(pairs=4, partial_rotary_factor=0.5)},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "attention_bias": True,
            "use_qk_norm": True,
            "norm_topk_prob": False,
            "rope_parameters": dict(FULL_ROTARY),
            "tie_word_embeddings": True,
            "hidden_act": "gelu",
        },
        "yarn": {
            "rope_parameters": {**YARN, "partial_rotary_factor": 0.5},
            "num_experts_per_tok": 1,
            "norm_topk_prob": True,
        },
    }

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        # fields mlx-lm's ModelArgs requires that transformers 5 may leave out
        tc.setdefault("rope_scaling", None)
        tc.setdefault("use_qk_norm", False)
        tc.setdefault("attention_bias", False)
        tc.setdefault("partial_rotary_factor", 0.5)
        return super().normalize(tc)

    def kv_token_bytes(self, tc: dict[str, Any], itemsize: int) -> int:
        return Family.kv_token_bytes(self, tc, itemsize)  # standard attention, not DeepSeek's MLA

    def interleaved_rope(self, tc: dict[str, Any]) -> bool | None:
        return None  # GLM rotates halves (transformers and mlx-lm alike)

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        first = int(tc.get("first_k_dense_replace") or 0)
        return list(range(first, int(tc["num_hidden_layers"])))
