"""Audit rows of the DeepSeek families: deepseek_v2, deepseek_v3 (also kimi_k2), glm4_moe."""

from __future__ import annotations

from edge0.model.fields.rules import Rope, Rule, computed, edge0, irrelevant, only

SHAPE = "mlx-lm builds the layer sizes from it; the weights' shapes are checked against it"
ROUTING = "the family's router takes it (golden-tested in the family fixture)"
DENSE_FIRST = "the first k layers are dense (golden-tested at 1)"
NO_FREQ = "transformers makes every layer from first_k_dense_replace sparse (mlx-lm's key)"
MTP = "multi-token-prediction layers: transformers does not run them, Edge0 drops them"
ALL_ROPES = ("default", "linear", "dynamic", "yarn", "llama3")
TIED = "mlx-lm's {} always has its own lm_head"

MLA: dict[str, Rule | Rope] = {
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
    "first_k_dense_replace": edge0(DENSE_FIRST),
    "moe_layer_freq": only(None, 1, why=NO_FREQ),
}

V3_ROUTER: dict[str, Rule | Rope] = {
    "norm_topk_prob": computed("renormalise the top-k sigmoid weights (golden-tested both)"),
    "topk_method": edge0("transformers ignores it (always noaux_tc); Edge0 tells mlx-lm so"),
    "scoring_func": edge0("transformers ignores it (always sigmoid); Edge0 tells mlx-lm so"),
}

DEEPSEEK: dict[str, dict[str, Rule | Rope]] = {
    "deepseek_v2": {
        **MLA,
        "rope_parameters": Rope(
            ("default", "yarn"),
            "mlx-lm's deepseek_v2 builds its own YaRN rope only "
            "(default = YaRN with factor 1, exactly)",
            extra={"truncate": True},
        ),
        "topk_method": computed("greedy or group_limited_greedy (golden-tested both)"),
        "norm_topk_prob": edge0("mlx-lm never renormalises: refused when true with top-k > 1"),
        "mlp_bias": only(False, why="mlx-lm's deepseek_v2 MLPs have no biases"),
        "tie_word_embeddings": only(False, why=TIED.format("deepseek_v2")),
    },
    "deepseek_v3": {
        **MLA,
        **V3_ROUTER,
        "rope_parameters": Rope(ALL_ROPES, "mlx-lm's deepseek_v3 builds these rope types only"),
        "rope_interleave": only(True, why="mlx-lm's deepseek_v3 rotates interleaved pairs only"),
        "num_nextn_predict_layers": irrelevant(MTP),
        "tie_word_embeddings": only(False, why=TIED.format("deepseek_v3")),
    },
    "glm4_moe": {
        **{
            k: MLA[k]
            for k in (
                "moe_intermediate_size",
                "n_routed_experts",
                "n_shared_experts",
                "routed_scaling_factor",
                "n_group",
                "topk_group",
                "first_k_dense_replace",
            )
        },
        **V3_ROUTER,
        "rope_parameters": Rope(
            ("default",), "mlx-lm's glm4_moe builds a plain partial RoPE", partial=True
        ),
        "attention_bias": computed("q/k/v biases (golden-tested)"),
        "use_qk_norm": computed("RMSNorm of q and k per head (golden-tested)"),
        "head_dim": computed("mlx-lm takes it (transformers: hidden_size // heads when absent)"),
        "num_nextn_predict_layers": irrelevant(MTP),
        "tie_word_embeddings": only(False, why=TIED.format("glm4_moe")),
    },
}
