"""Config values off each family's defaults that transformers applies: the config audit's probes.

Each probe is a family's tiny fixture (edge0.synth.tiny_families) with some config
values changed; tools/config_probe.py runs transformers and Edge0 on it and prints
the logit delta or Edge0's refusal. The probes whose answer is "computed" are committed
as fixtures with golden logits (tests/fixtures/families/<probe>.json); the refused ones
are checked by tests/test_config_fidelity.py for their one-line message.
"""

from __future__ import annotations

from typing import Any

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
}
LINEAR = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
DYNAMIC = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "short_factor": [1.0] * 8,
    "long_factor": [float(i + 1) for i in range(8)],
}
ROPES = {"linear": LINEAR, "dynamic": DYNAMIC, "yarn": YARN, "llama3": LLAMA3, "longrope": LONGROPE}


def _family(base: str, prefix: str = "", **extra: dict[str, Any]) -> dict[str, Any]:
    """The rope probes of `base` (keys under `prefix`, e.g. "text_config.") and `extra`."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for kind, rope in ROPES.items():
        changes: dict[str, Any] = {f"{prefix}rope_parameters": dict(rope)}
        if kind == "dynamic":  # dynamic NTK rescales past max_position_embeddings only
            changes[f"{prefix}max_position_embeddings"] = 16
        out[f"{base}-rope-{kind}"] = (base, changes)
    for name, changes in extra.items():
        out[f"{base}-{name}"] = (base, changes)
    return out


PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    **_family(
        "qwen3_moe",
        attention_bias={"attention_bias": True},
        sliding_window={"use_sliding_window": True, "sliding_window": 4},
        head_dim={"head_dim": 32},
        gelu={"hidden_act": "gelu"},
        tied={"tie_word_embeddings": True},
        sparse_step={"decoder_sparse_step": 2},
        mlp_only={"mlp_only_layers": [0]},
        no_norm_topk={"norm_topk_prob": False},
    ),
    **_family(
        "mixtral",
        sliding_window={"sliding_window": 4},
        head_dim={"head_dim": 32},
        gelu={"hidden_act": "gelu"},
        tied={"tie_word_embeddings": True},
        jitter={"router_jitter_noise": 0.1},
    ),
    **_family(
        "olmoe",
        attention_bias={"attention_bias": True},
        clip_qkv={"clip_qkv": 0.5},
        head_dim={"head_dim": 32},
        tied={"tie_word_embeddings": True},
        norm_topk={"norm_topk_prob": True},
        gelu={"hidden_act": "gelu"},
    ),
    **_family(
        "qwen2_moe",
        no_qkv_bias={"qkv_bias": False},
        sliding_window={"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 3},
        head_dim={"head_dim": 32},
        tied={"tie_word_embeddings": True},
        gelu={"hidden_act": "gelu"},
    ),
    **_family(
        "deepseek_v2",
        rope_default={"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        attention_bias={"attention_bias": True},
        mlp_bias={"mlp_bias": True},
        greedy={"topk_method": "greedy"},
        q_lora={"q_lora_rank": 32},
        tied={"tie_word_embeddings": True},
        gelu={"hidden_act": "gelu"},
    ),
    **_family(
        "deepseek_v3",
        no_interleave={"rope_interleave": False},
        yarn_mscale={"rope_parameters": dict(YARN, mscale=1.0, mscale_all_dim=1.0)},
        attention_bias={"attention_bias": True},
        no_q_lora={"q_lora_rank": None},
        no_norm_topk={"norm_topk_prob": False},
        tied={"tie_word_embeddings": True},
        gelu={"hidden_act": "gelu"},
    ),
    **_family(
        "glm4_moe",
        attention_bias={"attention_bias": True},
        qk_norm={"use_qk_norm": True},
        partial_rotary={
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
            }
        },
        no_norm_topk={"norm_topk_prob": False},
        tied={"tie_word_embeddings": True},
        gelu={"hidden_act": "gelu"},
    ),
    **_family(
        "gpt_oss",
        no_attention_bias={"attention_bias": False},
        yarn_untruncated={"rope_parameters": dict(YARN, truncate=False)},
        rope_default={"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        tied={"tie_word_embeddings": True},
        all_full={"layer_types": ["full_attention"] * 4},
    ),
    **_family(
        "granitemoe",
        attention_bias={"attention_bias": True},
        tied={"tie_word_embeddings": True},
        gelu={"hidden_act": "gelu"},
    ),
    **_family(
        "qwen3_next",
        attention_bias={"attention_bias": True},
        tied={"tie_word_embeddings": True},
        partial_rotary={
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            }
        },
        conv_kernel={"linear_conv_kernel_dim": 3},
        gelu={"hidden_act": "gelu"},
    ),
    **_family(
        "qwen3_5_moe",
        prefix="text_config.",
        attention_bias={"text_config.attention_bias": True},
        tied={"text_config.tie_word_embeddings": True},
        conv_kernel={"text_config.linear_conv_kernel_dim": 3},
        no_norm_topk={"text_config.norm_topk_prob": False},
        mlp_only={"text_config.mlp_only_layers": [1]},
    ),
    **_family(
        "llama4",
        prefix="text_config.",
        no_temperature={"text_config.attn_temperature_tuning": False},
        no_qk_norm={"text_config.use_qk_norm": False},
        attention_bias={"text_config.attention_bias": True},
        tied={"text_config.tie_word_embeddings": True},
    ),
}

# gpt-oss-20b's released rope (truncate false), on the gpt_oss fixture
GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
    "rope_theta": 150000.0,
}

# computed non-default values, committed with golden logits (tools/family_fixtures.py NAME)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_moe-variant": (
        "qwen3_moe",
        {
            "head_dim": 32,
            "tie_word_embeddings": True,
            "decoder_sparse_step": 2,
            "norm_topk_prob": False,
        },
    ),
    "mixtral-variant": ("mixtral", {"tie_word_embeddings": True}),
    "olmoe-variant": (
        "olmoe",
        {
            "attention_bias": True,
            "tie_word_embeddings": True,
            "norm_topk_prob": True,
            "rope_parameters": dict(YARN),
        },
    ),
    "deepseek_v2-variant": (
        "deepseek_v2",
        {
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "topk_method": "greedy",
            "q_lora_rank": 32,
            "attention_bias": True,
        },
    ),
    "deepseek_v3-variant": (
        "deepseek_v3",
        {
            "rope_parameters": dict(LLAMA3),
            "q_lora_rank": None,
            "attention_bias": True,
            "norm_topk_prob": False,
        },
    ),
    "glm4_moe-variant": (
        "glm4_moe",
        {
            "attention_bias": True,
            "use_qk_norm": True,
            "norm_topk_prob": False,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
            },
        },
    ),
    "gpt_oss-variant": ("gpt_oss", {"rope_parameters": dict(GPT_OSS_ROPE)}),
    "granitemoe-variant": (
        "granitemoe",
        {"attention_bias": True, "tie_word_embeddings": True, "rope_parameters": dict(LLAMA3)},
    ),
    "qwen3_next-variant": (
        "qwen3_next",
        {
            "attention_bias": True,
            "linear_conv_kernel_dim": 3,
            "mlp_only_layers": [1],
            "norm_topk_prob": False,
            "rope_parameters": {**DYNAMIC, "partial_rotary_factor": 0.5},
            "max_position_embeddings": 16,
        },
    ),
    "qwen3_5_moe-variant": (
        "qwen3_5_moe",
        {
            "text_config.attention_bias": True,
            "text_config.linear_conv_kernel_dim": 3,
            "text_config.mlp_only_layers": [1],
        },
    ),
    "llama4-variant": (
        "llama4",
        {
            "text_config.attention_bias": True,
            "text_config.attn_temperature_tuning": False,
            "text_config.rope_parameters": dict(YARN),
        },
    ),
}

# refused values: (fixture, config changes, the start of the one-line refusal)
REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    (
        "qwen3_moe",
        {"use_sliding_window": True, "sliding_window": 4},
        "sliding_window=4: mlx-lm's qwen3_moe attends over the whole context",
    ),
    ("qwen3_moe", {"rope_parameters": dict(YARN)}, 'rope_parameters.rope_type="yarn"'),
    ("qwen3_moe", {"attention_bias": True}, "attention_bias=true: mlx-lm's qwen3_moe attention"),
    ("qwen3_next", {"hidden_act": "gelu"}, 'hidden_act="gelu": mlx-lm\'s SwiGLU blocks hard-code'),
    ("qwen3_next", {"rope_parameters": dict(LONGROPE)}, 'rope_parameters.rope_type="longrope"'),
    ("mixtral", {"sliding_window": 4}, "sliding_window=4: mlx-lm's mixtral attends over the whole"),
    ("mixtral", {"rope_parameters": dict(LINEAR)}, 'rope_parameters.rope_type="linear"'),
    ("mixtral", {"head_dim": 32}, "head_dim=32: mlx-lm's mixtral takes hidden_size // heads"),
    ("olmoe", {"clip_qkv": 0.5}, "clip_qkv=0.5: mlx-lm's olmoe never clips"),
    (
        "olmoe",
        {"rope_parameters": dict(YARN, attention_factor=2.0)},
        "rope_parameters.attention_factor=2.0",
    ),
    ("qwen2_moe", {"tie_word_embeddings": True}, "tie_word_embeddings=true: mlx-lm's qwen2_moe"),
    ("qwen2_moe", {"qkv_bias": False}, "qkv_bias=false: mlx-lm's qwen2_moe always has"),
    (
        "qwen2_moe",
        {"layer_types": ["sliding_attention", "full_attention", "full_attention"]},
        'layer_types=["sliding_attention"',
    ),
    ("deepseek_v2", {"mlp_bias": True}, "mlp_bias=true: mlx-lm's deepseek_v2 MLPs have no"),
    (
        "deepseek_v2",
        {"rope_parameters": dict(YARN, truncate=False)},
        "rope_parameters.truncate=false",
    ),
    ("deepseek_v3", {"rope_interleave": False}, "rope_interleave=false: mlx-lm's deepseek_v3"),
    ("deepseek_v3", {"moe_layer_freq": 2}, "moe_layer_freq=2: transformers makes every layer"),
    ("glm4_moe", {"rope_parameters": dict(YARN)}, 'rope_parameters.rope_type="yarn"'),
    ("glm4_moe", {"tie_word_embeddings": True}, "tie_word_embeddings=true: mlx-lm's glm4_moe"),
    ("gpt_oss", {"attention_bias": False}, "attention_bias=false: mlx-lm's gpt_oss"),
    ("gpt_oss", {"rope_parameters": dict(DYNAMIC)}, 'rope_parameters.rope_type="dynamic"'),
    ("granitemoe", {"hidden_act": "gelu"}, 'hidden_act="gelu"'),
    ("granitemoe", {"head_dim": 32}, "head_dim=32: mlx-lm's granitemoe takes hidden_size"),
    (
        "qwen3_5_moe",
        {"text_config.tie_word_embeddings": True},
        "text_config.tie_word_embeddings=true: transformers ties Qwen3.5 by the top-level",
    ),
    (
        "qwen3_5_moe",
        {"text_config.rope_parameters": dict(YARN, partial_rotary_factor=0.25)},
        'text_config.rope_parameters.rope_type="yarn"',
    ),
    (
        "llama4",
        {"text_config.tie_word_embeddings": True},
        "text_config.tie_word_embeddings=true: mlx-lm's llama4",
    ),
    (
        "llama4",
        {"text_config.rope_parameters": dict(LONGROPE)},
        'text_config.rope_parameters.rope_type="longrope"',
    ),
]
