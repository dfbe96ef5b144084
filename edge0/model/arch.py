"""Supported MoE families: config.json checks, normalisation for mlx-lm, model classes."""

from __future__ import annotations

import importlib
from typing import Any

import mlx.nn as nn

from edge0.errors import ModelLoadError

# config.json model_type -> mlx-lm model module. The text-only Qwen3.5 MoE config
# (transformers' Qwen3_5MoeForCausalLM) runs on the same mlx-lm class.
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "qwen3_moe": "qwen3_moe",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
}
# Dense (non-MoE) families people are likely to point Edge0 at by mistake.
_DENSE_TYPES = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_5",
    "qwen3_5_text",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "phi3",
    "gpt2",
    "gpt_neox",
    "starcoder2",
    "olmo2",
    "smollm3",
}


def supported_list() -> str:
    return ", ".join(t for t in SUPPORTED_MODEL_TYPES if not t.endswith("_text"))


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config (`text_config` when nested, else the config)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def check_supported(config: dict[str, Any], where: str) -> str:
    """Return the mlx-lm module name for this config or raise ModelLoadError naming `where`."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ModelLoadError(
            f"{where}: no model_type in config.json; is this a Hugging Face or mlx-lm model "
            f"directory? Edge0 supports {supported_list()}"
        )
    if model_type in SUPPORTED_MODEL_TYPES:
        if int(text_config(config).get("num_experts") or _experts(config)) <= 0:
            raise ModelLoadError(
                f"{where}: model_type {model_type!r} with num_experts=0 is a dense model, not "
                f"a Mixture-of-Experts one; Edge0 runs MoE checkpoints ({supported_list()})"
            )
        return SUPPORTED_MODEL_TYPES[model_type]
    if model_type in _DENSE_TYPES or (_mlx_lm_knows(model_type) and _experts(config) == 0):
        raise ModelLoadError(
            f"{where}: model_type {model_type!r} is not a Mixture-of-Experts model; Edge0 "
            f"streams experts and runs MoE checkpoints: {supported_list()}"
        )
    raise ModelLoadError(
        f"{where}: model_type {model_type!r} is not supported; Edge0 supports "
        f"{supported_list()} (use a checkpoint of one of these families)"
    )


def _experts(config: dict[str, Any]) -> int:
    tc = text_config(config)
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(tc.get(key), int):
            return int(tc[key])
    return 0


def _mlx_lm_knows(model_type: str) -> bool:
    try:
        importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError:
        return False
    return True


def normalize_config(config: dict[str, Any]) -> dict[str, Any]:
    """Fill the fields mlx-lm expects from transformers-5 style configs (a new dict).

    transformers 5 writes `num_local_experts` and `rope_parameters` where mlx-lm's
    qwen3_moe reads `num_experts` and `rope_theta`; Qwen3.5 lists `layer_types` where
    mlx-lm reads `full_attention_interval`. Idempotent.
    """
    config = dict(config)
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = _normalize_text(dict(config["text_config"]))
    else:
        config = _normalize_text(config)
    return config


def _normalize_text(tc: dict[str, Any]) -> dict[str, Any]:
    if "num_experts" not in tc and "num_local_experts" in tc:
        tc["num_experts"] = tc["num_local_experts"]
    rope = tc.get("rope_parameters")
    if isinstance(rope, dict):
        tc.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        if "partial_rotary_factor" in rope:
            tc.setdefault("partial_rotary_factor", rope["partial_rotary_factor"])
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default" and tc.get("model_type") == "qwen3_moe":
            tc.setdefault("rope_scaling", rope)
    if tc.get("head_dim") is None and "hidden_size" in tc and "num_attention_heads" in tc:
        tc["head_dim"] = tc["hidden_size"] // tc["num_attention_heads"]
    tc.setdefault("tie_word_embeddings", False)
    tc.setdefault("mlp_only_layers", [])
    tc.setdefault("decoder_sparse_step", 1)
    tc.setdefault("norm_topk_prob", tc.get("model_type") != "qwen3_moe")
    layer_types = tc.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        tc["full_attention_interval"] = _interval(layer_types)
    return tc


def _interval(layer_types: list[str]) -> int:
    """The period of full-attention layers; mlx-lm's Qwen3.5 only supports a regular one."""
    n = layer_types.index("full_attention") + 1 if "full_attention" in layer_types else 0
    expected = [
        "full_attention" if n and (i + 1) % n == 0 else "linear_attention"
        for i in range(len(layer_types))
    ]
    if n == 0 or expected != layer_types:
        raise ModelLoadError(
            f"layer_types {layer_types} is not 'every n-th layer is full attention'; "
            "mlx-lm's qwen3_5_moe cannot run this layer pattern"
        )
    return n


def model_classes(config: dict[str, Any], where: str = "config.json") -> tuple[Any, Any]:
    """(Model, ModelArgs) from mlx-lm for a supported config."""
    module = importlib.import_module(f"mlx_lm.models.{check_supported(config, where)}")
    return module.Model, module.ModelArgs


def instantiate(config: dict[str, Any], where: str = "config.json") -> nn.Module:
    """An mlx-lm model for a normalised config; weights are random until loaded."""
    model_cls, args_cls = model_classes(config, where)
    try:
        args = args_cls.from_dict(config)
        model: nn.Module = model_cls(args)
    except (TypeError, ValueError, KeyError) as exc:
        raise ModelLoadError(
            f"{where}: config does not describe a valid {config.get('model_type')} model "
            f"({exc}); re-download or re-convert the checkpoint"
        ) from exc
    return model
