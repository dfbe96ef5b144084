"""DeepSeek-V2 / V2-Lite: softmax, greedy or group-limited greedy top-k, scaled, not renormalised.

`group_limited_greedy` keeps the best `topk_group` of `n_group` groups (a group
scores by its best expert) before the top-k. Gate weights are the softmax
probabilities of the set times routed_scaling_factor (mlx-lm's block never
renormalises). Shared experts are added ungated; the first
`first_k_dense_replace` layers are dense.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from edge0.families import tiny
from edge0.families.audit import ROPE, SHAPE, TIED_OK, Fields, computed, edge0, irrelevant
from edge0.families.base import PROJECTIONS, Family
from edge0.families.probes import LINEAR
from edge0.families.shared import dense_first_then_sparse
from edge0.model import attention

ROUTING = "the family's router takes it (golden-tested in the family fixture)"
# multi-head latent attention and the DeepSeek router: the rows deepseek_v3 shares
MLA: Fields = {
    "kv_lora_rank": computed(SHAPE + " (latent attention)"),
    "q_lora_rank": computed("low-rank queries, or full ones when null (golden-tested both)"),
    "qk_nope_head_dim": computed(SHAPE),
    "qk_rope_head_dim": computed(SHAPE + " (the rotated part)"),
    "v_head_dim": computed(SHAPE),
    "head_dim": irrelevant("transformers derives it (qk_rope_head_dim) for its rope helper"),
    "qk_head_dim": irrelevant("transformers derives it (qk_nope_head_dim + qk_rope_head_dim)"),
    "attention_bias": computed("biases of the q/kv down-projections and o (golden-tested)"),
    "pretraining_tp": irrelevant("tensor-parallel slicing in pretraining; unused by the model"),
    "moe_intermediate_size": computed(SHAPE + " (experts)"),
    "n_routed_experts": edge0("routed experts per sparse layer (the expert records)"),
    "n_shared_experts": computed(SHAPE + " (ungated shared experts)"),
    "routed_scaling_factor": computed(ROUTING),
    "n_group": computed(ROUTING),
    "topk_group": computed(ROUTING),
    "first_k_dense_replace": edge0("the first k layers are dense (golden-tested at 1)"),
    "moe_layer_freq": edge0(
        "transformers ignores it (every layer from first_k_dense_replace is sparse); Edge0 "
        "tells mlx-lm 1"
    ),
}
_YARN_V2 = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}


def _tiny(vocab: int) -> Any:
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        **tiny.common(vocab),
        intermediate_size=2 * tiny.FF,
        moe_intermediate_size=tiny.FF,
        num_key_value_heads=tiny.HEADS,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        topk_method="group_limited_greedy",
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.5,
        rope_parameters=dict(_YARN_V2, factor=4.0, original_max_position_embeddings=64),
    )


def _deepseek_v2_lite() -> Any:
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        vocab_size=102400,
        hidden_size=2048,
        intermediate_size=10944,
        moe_intermediate_size=1408,
        num_hidden_layers=27,
        num_attention_heads=16,
        num_key_value_heads=16,
        n_routed_experts=64,
        n_shared_experts=2,
        num_experts_per_tok=6,
        first_k_dense_replace=1,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        topk_method="greedy",
        routed_scaling_factor=1.0,
        max_position_embeddings=163840,
        rope_parameters=_YARN_V2,
        dtype="bfloat16",
    )


class DeepseekV2(Family):
    name = "deepseek_v2"
    model_types: ClassVar[dict[str, str]] = {"deepseek_v2": "deepseek_v2"}
    expert_keys = ("n_routed_experts",)
    routing = "softmax, (group-limited) greedy top-k, scaled"
    shared = "ungated (n_shared_experts)"
    rope_in_attention = True  # YaRN's mscale_all_dim scales its softmax too

    fields: ClassVar[Fields] = {
        **MLA,
        "rope_parameters": ROPE,
        "topk_method": computed("greedy or group_limited_greedy (golden-tested both)"),
        "norm_topk_prob": irrelevant("transformers' deepseek_v2 never renormalises (nor mlx-lm's)"),
        "mlp_bias": computed("biases of the dense and shared-expert MLPs (golden-tested)"),
        "tie_word_embeddings": computed(TIED_OK),
    }

    flagships: ClassVar[dict[str, Any]] = {"deepseek-v2-lite": _deepseek_v2_lite}
    probes: ClassVar[dict[str, dict[str, Any]]] = {
        "rope_default": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        "attention_bias": {"attention_bias": True},
        "mlp_bias": {"mlp_bias": True},
        "greedy": {"topk_method": "greedy"},
        "q_lora": {"q_lora_rank": 32},
        "tied": {"tie_word_embeddings": True},
        "gelu": {"hidden_act": "gelu"},
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "variant": {
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "topk_method": "greedy",
            "q_lora_rank": 32,
            "attention_bias": True,
            "mlp_bias": True,
            "tie_word_embeddings": True,
        },
        "rope": {"rope_parameters": dict(LINEAR), "hidden_act": "gelu"},
    }

    def tiny(self, vocab: int) -> Any:
        return _tiny(vocab)

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        tc["moe_layer_freq"] = 1  # transformers makes every layer from first_k_dense_replace sparse
        if not tc.get("rope_scaling"):  # mlx-lm builds YaRN always; factor 1 is plain RoPE
            theta = (tc.get("rope_parameters") or {}).get("rope_theta", tc.get("rope_theta"))
            yarn = {
                "rope_type": "yarn",
                "factor": 1.0,
                "rope_theta": theta,
                "original_max_position_embeddings": tc.get("max_position_embeddings"),
            }
            tc["rope_scaling"] = tc["rope_parameters"] = yarn  # the same, said as YaRN
        return tc

    def interleaved_rope(self, tc: dict[str, Any]) -> bool | None:
        return True  # transformers' deepseek_v2 rotates complex pairs

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        return dense_first_then_sparse(tc)

    def kv_token_bytes(self, tc: dict[str, Any], itemsize: int) -> int:
        """mlx-lm's deepseek_v2 caches each head's keys (nope and rope parts) and values."""
        per_head = tc["qk_nope_head_dim"] + tc["qk_rope_head_dim"] + tc["v_head_dim"]
        return int(tc["num_attention_heads"]) * int(per_head) * itemsize

    def adapt(self, model: nn.Module, tc: dict[str, Any]) -> None:
        """Biases on the dense and shared-expert MLPs (`mlp_bias`), which mlx-lm's lack."""
        if tc.get("mlp_bias"):
            for layer in model.layers:
                mlp = layer.mlp
                for owner in [mlp["shared_experts"]] if "shared_experts" in mlp else [mlp]:
                    attention.projections(owner, dict.fromkeys(PROJECTIONS, True))

    def router_logits(self, block: nn.Module, x: mx.array) -> mx.array:
        out: mx.array = x @ block.gate.weight.T
        return out

    def select(self, block: nn.Module, scores: mx.array, k: int) -> tuple[mx.array, mx.array]:
        g = block.gate
        ranked = scores
        if g.topk_method == "group_limited_greedy":
            grouped = mx.unflatten(scores, axis=-1, shape=(g.n_group, -1))
            group_scores = grouped.max(axis=-1, keepdims=True)
            drop = g.n_group - g.topk_group
            group_idx = mx.argpartition(group_scores, kth=drop - 1, axis=-2)[..., :drop, :]
            grouped = mx.put_along_axis(grouped, group_idx, mx.array(0.0, scores.dtype), axis=-2)
            ranked = mx.flatten(grouped, -2, -1)
        inds = mx.argpartition(-ranked, kth=k - 1, axis=-1)[..., :k]
        return inds, self.weights(block, scores, inds)

    def weights(self, block: nn.Module, scores: mx.array, inds: mx.array) -> mx.array:
        return mx.take_along_axis(scores, inds, axis=-1) * block.gate.routed_scaling_factor

    def extra(self, block: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        if "shared_experts" in block:
            return y + block.shared_experts(x)
        return y
