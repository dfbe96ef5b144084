"""Audit rows of mixtral, olmoe, gpt_oss, granitemoe and llama4 (its text config)."""

from __future__ import annotations

from edge0.model.fields.qwen import derived_head_dim
from edge0.model.fields.rules import Rope, Rule, computed, edge0, irrelevant, only, where

SHAPE = "mlx-lm builds the layer sizes from it; the weights' shapes are checked against it"
ROPES = ("default", "linear", "dynamic", "yarn", "llama3")  # mlx-lm's initialize_rope, tested
NO_LONGROPE = "mlx-lm's {} builds these rope types (longrope differs from transformers')"
HALVES = "transformers rotates halves, never pairs (mlx-lm's own key)"
EXPERTS = "routed experts per sparse layer (the expert records)"
TIED_OK = "the lm_head is the embedding (golden-tested tied)"
GRANITE = "Granite's scaling; mlx-lm's granitemoe takes it (golden-tested in the family fixture)"
LLAMA4_LAYOUT = "mlx-lm's llama4 hard-codes the pattern: checked by the family (one line)"

OTHERS: dict[str, dict[str, Rule | Rope]] = {
    "mixtral": {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": Rope(
            ("default",), "mlx-lm's mixtral builds a plain RoPE from rope_theta and drops scaling"
        ),
        "sliding_window": only(None, why="mlx-lm's mixtral attends over the whole context"),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "mlx-lm's mixtral takes hidden_size // heads",
        ),
        "tie_word_embeddings": computed(TIED_OK),
        "rope_traditional": only(None, False, why=HALVES),
    },
    "olmoe": {
        "num_experts": edge0(EXPERTS),
        "rope_parameters": Rope(ROPES, NO_LONGROPE.format("olmoe")),
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "clip_qkv": only(None, why="mlx-lm's olmoe never clips q, k and v"),
        "norm_topk_prob": computed("renormalise the top-k weights (golden-tested both ways)"),
        "tie_word_embeddings": computed(TIED_OK),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "OLMoE's q/k norms span hidden_size (transformers fails otherwise)",
        ),
        "mlp_bias": only(None, False, why="transformers' OLMoE experts have no biases"),
        "rope_traditional": only(None, False, why=HALVES),
    },
    "gpt_oss": {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": Rope(
            ("default", "linear", "yarn", "llama3"),
            "mlx-lm's gpt_oss builds these rope types (dynamic fails inside mlx-lm)",
        ),
        "attention_bias": only(True, why="mlx-lm's gpt_oss attention always has biases"),
        "head_dim": computed(SHAPE),
        "sliding_window": computed("the window of sliding_attention layers (fixture: 4)"),
        "layer_types": where(
            lambda v, _: v is None or "sliding_attention" in v,
            "a pattern with sliding_attention layers",
            "mlx-lm's gpt_oss builds its masks for sliding and full layers both",
        ),
        "swiglu_alpha": only(1.702, why="mlx-lm's SwigluOAI hard-codes alpha 1.702"),
        "swiglu_limit": only(7.0, why="mlx-lm's SwigluOAI hard-codes limit 7.0"),
        "hidden_act": irrelevant("transformers' gpt-oss experts use their own clamped SwiGLU"),
        "tie_word_embeddings": only(False, why="mlx-lm's gpt_oss always has its own lm_head"),
    },
    "granitemoe": {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": Rope(ROPES, NO_LONGROPE.format("granitemoe")),
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "head_dim": where(
            derived_head_dim,
            "hidden_size // num_attention_heads",
            "mlx-lm's granitemoe takes hidden_size // heads",
        ),
        "embedding_multiplier": computed(GRANITE),
        "attention_multiplier": computed(GRANITE),
        "residual_multiplier": computed(GRANITE),
        "logits_scaling": computed(GRANITE),
        "tie_word_embeddings": computed(TIED_OK),
    },
    "llama4_text": {
        "num_local_experts": edge0(EXPERTS),
        "rope_parameters": Rope(ROPES, NO_LONGROPE.format("llama4")),
        "attention_bias": computed("q/k/v/o biases (golden-tested)"),
        "head_dim": computed(SHAPE),
        "intermediate_size_mlp": computed(SHAPE + " (the dense layers' MLP)"),
        "attention_chunk_size": computed("chunked attention of the RoPE layers (fixture: 4)"),
        "attn_temperature_tuning": computed("NoPE layers' query temperature (fixture: on)"),
        "floor_scale": computed("the temperature's floor (fixture: 4)"),
        "attn_scale": computed("the temperature's slope (fixture: 0.1)"),
        "use_qk_norm": computed("q/k RMSNorm on the RoPE layers (eps from rms_norm_eps)"),
        "interleave_moe_layer_step": edge0("every n-th layer is sparse (fixture: 2)"),
        "moe_layers": edge0(LLAMA4_LAYOUT),
        "no_rope_layers": edge0(LLAMA4_LAYOUT),
        "no_rope_layer_interval": edge0(LLAMA4_LAYOUT + " (through no_rope_layers)"),
        "layer_types": edge0(LLAMA4_LAYOUT),
        "tie_word_embeddings": only(False, why="mlx-lm's llama4 always has its own lm_head"),
    },
}
