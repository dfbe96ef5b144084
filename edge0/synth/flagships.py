"""Full-size shapes of each family's flagship model (config.json as the released checkpoint has it).

Values are the published configs' architecture fields, built with transformers'
config classes; edge0.synth.layout's `plan_sizes` gives a shape's resident and expert
bytes in the edge0 layout without writing anything.
"""

from __future__ import annotations

from typing import Any

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


def _mixtral_8x7b() -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        dtype="bfloat16",
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


def _moonlight_16b_a3b() -> Any:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=163840,
        hidden_size=2048,
        intermediate_size=11264,
        moe_intermediate_size=1408,
        num_hidden_layers=27,
        num_attention_heads=16,
        num_key_value_heads=16,
        n_routed_experts=64,
        n_shared_experts=2,
        num_experts_per_tok=6,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        routed_scaling_factor=2.446,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        dtype="bfloat16",
    )


def _glm45_air() -> Any:
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        vocab_size=151552,
        hidden_size=4096,
        intermediate_size=10944,  # type: ignore[call-arg]
        moe_intermediate_size=1408,
        num_hidden_layers=46,
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


def _glm45_air_cut() -> Any:  # a stated layer cut: full width, 6 of the 46 layers (5 sparse)
    config = _glm45_air()
    config.num_hidden_layers = 6
    return config


_YARN_OSS = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def _gpt_oss(layers: int, experts: int) -> Any:
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=layers,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=experts,
        num_experts_per_tok=4,
        sliding_window=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters=_YARN_OSS,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def _granite_31_3b_a800m() -> Any:
    from transformers import GraniteMoeConfig

    return GraniteMoeConfig(
        vocab_size=49155,
        hidden_size=1536,
        intermediate_size=512,
        num_hidden_layers=32,
        num_attention_heads=24,
        num_key_value_heads=8,
        num_local_experts=40,
        num_experts_per_tok=8,
        max_position_embeddings=131072,
        embedding_multiplier=12.0,
        logits_scaling=6.0,
        residual_multiplier=0.22,
        attention_multiplier=0.015625,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7},
        dtype="bfloat16",
    )


def _kimi_k2() -> Any:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=163840,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=61,
        num_attention_heads=64,
        num_key_value_heads=64,
        n_routed_experts=384,
        n_shared_experts=1,
        num_experts_per_tok=8,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
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
        dtype="bfloat16",
    )


def _llama4(experts: int, step: int, qk_norm: bool, rope: dict[str, Any], layers: int = 48) -> Any:
    """Llama-4 Scout (16 experts, every layer MoE) / Maverick (128, every 2nd): text part."""
    from transformers import Llama4Config

    text = dict(
        vocab_size=202048,
        hidden_size=5120,
        intermediate_size=8192,
        intermediate_size_mlp=16384,
        num_hidden_layers=layers,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        num_local_experts=experts,
        num_experts_per_tok=1,
        interleave_moe_layer_step=step,
        use_qk_norm=qk_norm,
        attention_chunk_size=8192,
        attn_temperature_tuning=True,
        floor_scale=8192,
        attn_scale=0.1,
        rms_norm_eps=1e-5,
        max_position_embeddings=10485760,
        rope_parameters=rope,
        tie_word_embeddings=False,
        bos_token_id=200000,
        eos_token_id=[200001, 200007, 200008],
        pad_token_id=200018,
    )
    vision = dict(
        hidden_size=1408,
        num_hidden_layers=34,
        num_attention_heads=16,
        intermediate_size=5632,
        image_size=336,
        patch_size=14,
        vision_output_dim=4096,
        projector_input_dim=4096,
        projector_output_dim=4096,
    )
    return Llama4Config(
        text_config=text, vision_config=vision, tie_word_embeddings=False, dtype="bfloat16"
    )


_ROPE_SCOUT = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 16.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}


FLAGSHIPS = {
    "mixtral-8x7b": _mixtral_8x7b,
    "olmoe-1b-7b": _olmoe_1b_7b,
    "qwen1.5-moe-a2.7b": _qwen15_moe_a27b,
    "deepseek-v2-lite": _deepseek_v2_lite,
    "moonlight-16b-a3b": _moonlight_16b_a3b,
    "glm-4.5-air": _glm45_air,
    "glm-4.5-air-6layers": _glm45_air_cut,  # fits this machine's disk (the full one: 56 GiB)
    "gpt-oss-20b": lambda: _gpt_oss(24, 32),
    "gpt-oss-120b": lambda: _gpt_oss(36, 128),
    "granite-3.1-3b-a800m": _granite_31_3b_a800m,
    "kimi-k2": _kimi_k2,
    "llama-4-scout-17b-16e": lambda: _llama4(16, 1, True, _ROPE_SCOUT),
    "llama-4-maverick-17b-128e": lambda: _llama4(
        128, 2, False, {"rope_type": "default", "rope_theta": 500000.0}
    ),
    # Scout's tensors, 4 layers (the fewest mlx-lm's llama4 runs), MoE every 2nd: 4 GB on disk,
    # a streamed run at Scout's width (67.5 MiB records) on this machine
    "llama-4-scout-4layers": lambda: _llama4(16, 2, True, _ROPE_SCOUT, layers=4),
}
# shapes whose released experts are not affine int4: the mode their checkpoints keep
EXPERT_MODES = {"gpt-oss-20b": "mxfp4", "gpt-oss-120b": "mxfp4"}


def expert_params(shape: str, bits: int, group_size: int) -> dict[str, Any]:
    """The experts' quantization of a shape: MXFP4 where its checkpoint has it, else affine."""
    if EXPERT_MODES.get(shape) == "mxfp4":
        return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    return {"group_size": group_size, "bits": bits, "mode": "affine"}


def expert_spec(model: Any, params: dict[str, Any]) -> Any:
    """(switch layers, E, record layout) of a float-shaped model's experts.

    Affine `params` gain the projections mlx-lm's predicate quantizes otherwise (in place).
    """
    from edge0.layout.quant import expert_projections, switch_modules
    from edge0.layout.records import record_layout

    if params["mode"] == "affine" and (own := expert_projections(model, params)):
        params["projections"] = own
    switch = switch_modules(model)
    first = switch[next(iter(switch))][1]
    n_experts, d_ff, d_model = first.gate_proj.weight.shape
    bias = "bfloat16" if "bias" in first.gate_proj else None  # gpt-oss
    scales = "uint8" if params["mode"] == "mxfp4" else "bfloat16"
    spec = record_layout(
        d_model,
        d_ff,
        params["bits"],
        params["group_size"],
        scales,
        params["mode"],
        bias,
        params.get("projections"),
    )
    return tuple(switch), int(n_experts), spec


# released under their own model_type, built with another architecture's config class
MODEL_TYPES = {"kimi-k2": "kimi_k2"}


def flagship_config(name: str) -> dict[str, Any]:
    out: dict[str, Any] = FLAGSHIPS[name]().to_dict()
    out["model_type"] = MODEL_TYPES.get(name, out["model_type"])
    return out
