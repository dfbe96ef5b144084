"""Llama-4's tiny fixture config and flagship shapes (Scout, Maverick): edge0.families.llama4's."""

from __future__ import annotations

from typing import Any

from edge0.families import tiny


def tiny_config(vocab: int) -> Any:
    """Scout's text model, 4 layers: MoE every 2nd layer, NoPE every 4th; chunks of 4 tokens
    and a temperature floor of 4 so the prompt crosses both; a tiny vision tower."""
    from transformers import Llama4Config

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    text = dict(
        **tiny.common(vocab, num_hidden_layers=4, rms_norm_eps=1e-5),
        intermediate_size=tiny.FF,
        intermediate_size_mlp=2 * tiny.FF,
        num_key_value_heads=tiny.KV,
        head_dim=tiny.HEAD_DIM,
        num_local_experts=8,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        attention_chunk_size=4,
        floor_scale=4,
        attn_scale=0.1,
        use_qk_norm=True,
        rope_parameters=rope,
    )
    vision = dict(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        vision_output_dim=32,
        image_size=28,
        patch_size=14,
        projector_input_dim=32,
        projector_output_dim=32,
    )
    return Llama4Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def flagship(experts: int, step: int, qk_norm: bool, rope: dict[str, Any], layers: int = 48) -> Any:
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


ROPE_SCOUT = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 16.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}
