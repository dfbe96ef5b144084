"""Audit rows of the Qwen families: qwen3_moe, qwen3_next, qwen3_5_moe (text), qwen2_moe."""

from __future__ import annotations

from typing import Any

from edge0.model.fields.rules import (
    Rope,
    Rule,
    computed,
    edge0,
    irrelevant,
    only,
    where,
)

SHAPE = "mlx-lm builds the layer sizes from it; the weights' shapes are checked against it"
PLAIN_ROPE = "mlx-lm's {} builds a plain RoPE from rope_theta and drops any scaling"
LAYERS = "the Qwen rule: a layer is sparse unless listed, and (i + 1) % step == 0"


def _no_window(value: Any, _: dict[str, Any]) -> bool:
    return value is None


def derived_head_dim(value: Any, cfg: dict[str, Any]) -> bool:
    """head_dim absent or hidden_size // num_attention_heads (what mlx-lm computes)."""
    return value is None or value == cfg["hidden_size"] // cfg["num_attention_heads"]


def _qwen3_common(name: str) -> dict[str, Rule | Rope]:
    return {
        "attention_bias": only(False, why=f"mlx-lm's {name} attention has no q/k/v/o biases"),
        "decoder_sparse_step": edge0(LAYERS + " (golden-tested at 2 on qwen3_moe)"),
        "mlp_only_layers": edge0(LAYERS + " (golden-tested with [1] on qwen3_next)"),
        "moe_intermediate_size": computed(SHAPE + " (experts)"),
        "norm_topk_prob": computed("renormalise the top-k weights (golden-tested both ways)"),
        "num_experts": edge0("routed experts per sparse layer (the expert records)"),
        "num_local_experts": edge0("routed experts per sparse layer (the expert records)"),
        "head_dim": computed("mlx-lm takes it (transformers: hidden_size // heads when absent)"),
        "tie_word_embeddings": computed("the lm_head is the embedding (golden-tested tied)"),
    }


HYBRID: dict[str, Rule | Rope] = {
    "layer_types": edge0(
        "linear (Gated DeltaNet) or full attention per layer; mlx-lm places full attention "
        "every n-th layer, so only that pattern is accepted (full_attention_interval)"
    ),
    "linear_conv_kernel_dim": computed("the DeltaNet's causal conv width (golden-tested at 3)"),
    "linear_key_head_dim": computed(SHAPE),
    "linear_value_head_dim": computed(SHAPE),
    "linear_num_key_heads": computed(SHAPE),
    "linear_num_value_heads": computed(SHAPE),
    "shared_expert_intermediate_size": computed(SHAPE + " (sigmoid-gated shared expert)"),
    "attention_bias": computed("mlx-lm's gated attention takes it (golden-tested)"),
}

QWEN: dict[str, dict[str, Rule | Rope]] = {
    "qwen3_moe": {
        **_qwen3_common("qwen3_moe"),
        "rope_parameters": Rope(("default",), PLAIN_ROPE.format("qwen3_moe")),
        "use_sliding_window": edge0("switches sliding_window on; checked through it"),
        "sliding_window": where(
            _no_window,
            "null (use_sliding_window false)",
            "mlx-lm's qwen3_moe attends over the whole context (no sliding window)",
        ),
    },
    "qwen3_next": {
        **_qwen3_common("qwen3_next"),
        **HYBRID,
        "rope_parameters": Rope(
            ("default", "linear", "dynamic", "yarn", "llama3"),
            "mlx-lm's qwen3_next builds these rope types only",
            partial=True,
        ),
        "tie_word_embeddings": computed("the lm_head is the embedding"),
    },
    "qwen3_5_moe_text": {
        **_qwen3_common("qwen3_5_moe"),
        **{
            k: edge0(
                "not read by transformers' Qwen3.5 (every layer sparse, top-k always "
                "renormalised); Edge0 ignores it too"
            )
            for k in ("decoder_sparse_step", "mlp_only_layers", "norm_topk_prob")
        },
        **HYBRID,
        "rope_parameters": Rope(
            ("default",),
            "mlx-lm's qwen3_5 builds a plain partial RoPE for text",
            partial=True,
            ignored={
                "mrope_section": "text positions are equal on all three axes",
                "mrope_interleaved": "text positions are equal on all three axes",
            },
        ),
        "tie_word_embeddings": only(
            False, why="transformers ties Qwen3.5 by the top-level field, mlx-lm by this one"
        ),
    },
    "qwen2_moe": {
        "decoder_sparse_step": only(1, why="mlx-lm's qwen2_moe makes every layer sparse"),
        "mlp_only_layers": only([], why="mlx-lm's qwen2_moe makes every layer sparse"),
        "norm_topk_prob": only(False, why="mlx-lm's qwen2_moe never renormalises the top-k"),
        "qkv_bias": only(True, why="mlx-lm's qwen2_moe always has q/k/v biases"),
        "moe_intermediate_size": computed(SHAPE + " (experts)"),
        "shared_expert_intermediate_size": computed(SHAPE + " (sigmoid-gated shared expert)"),
        "num_experts": edge0("routed experts per sparse layer (the expert records)"),
        "rope_parameters": Rope(("default",), PLAIN_ROPE.format("qwen2_moe")),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "mlx-lm's qwen2_moe takes hidden_size // heads",
        ),
        "tie_word_embeddings": only(False, why="mlx-lm's qwen2_moe always has its own lm_head"),
        "use_sliding_window": edge0("switches sliding windows on; checked through layer_types"),
        "max_window_layers": edge0("which layers slide; checked through layer_types"),
        "sliding_window": irrelevant("applies to layer_types' sliding_attention layers only"),
        "layer_types": where(
            lambda v, _: v is None or all(t == "full_attention" for t in v),
            "full_attention on every layer",
            "mlx-lm's qwen2_moe attends over the whole context (no sliding window)",
        ),
        "rope_traditional": only(None, False, why="transformers rotates halves, never pairs"),
    },
}
