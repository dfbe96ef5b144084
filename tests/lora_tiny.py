"""Tiny mlx-lm MoE models (qwen3_moe, qwen3_5_moe) built in memory for the LoRA tests."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

VOCAB = 96


def qwen3_moe_config(layers: int = 2) -> dict[str, Any]:
    return {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "num_hidden_layers": layers,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 256,
        "norm_topk_prob": True,
    }


def qwen3_5_moe_config(layers: int = 4) -> dict[str, Any]:
    text = {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "max_position_embeddings": 256,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "shared_expert_intermediate_size": 32,
        "moe_intermediate_size": 32,
        "tie_word_embeddings": False,
        "rope_parameters": {"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    }
    return {"model_type": "qwen3_5_moe", "text_config": text}


def _quantizable(path: str, module: nn.Module) -> bool:
    return hasattr(module, "to_quantized") and not path.endswith("embed_tokens")


def build(config: dict[str, Any], seed: int = 0, quantize: bool = True) -> nn.Module:
    """An mlx-lm model with seeded random weights; int4 (group 32) when `quantize`."""
    if config["model_type"] == "qwen3_moe":
        from mlx_lm.models import qwen3_moe as family
    else:
        from mlx_lm.models import qwen3_5_moe as family  # type: ignore[no-redef]
    mx.random.seed(seed)
    model = family.Model(family.ModelArgs.from_dict(config))
    # Spread the init a little so logits are not all ~0 (random-init mlx-lm layers are tame).
    params = [(k, v * 2.0 if v.ndim >= 2 else v) for k, v in tree_flatten(model.parameters())]
    model.load_weights(params)
    if quantize:
        nn.quantize(
            model,
            group_size=32,
            bits=4,
            class_predicate=lambda p, m: (
                hasattr(m, "to_quantized") and not p.endswith("embed_tokens")
            ),
        )
    mx.eval(model.parameters())
    model.eval()
    return model


def tokens(n: int = 12, batch: int = 2, seed: int = 1) -> mx.array:
    mx.random.seed(seed)
    return mx.random.randint(0, VOCAB, (batch, n))
