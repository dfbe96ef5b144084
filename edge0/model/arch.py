"""Config checks against the family registry, normalisation for mlx-lm, model classes."""

from __future__ import annotations

import importlib
from typing import Any

import mlx.nn as nn

from edge0 import families
from edge0.errors import ModelLoadError
from edge0.model import activations, attention, fields, rope

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
# Config keys by which other MoE families announce routed experts.
_EXPERT_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_num_experts",
    "num_experts_per_tok",
)


def supported_list() -> str:
    return families.supported_list()


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
    fam = families.FAMILIES.get(model_type)
    if fam is not None:
        if fam.n_experts(text_config(config)) <= 0:
            raise ModelLoadError(
                f"{where}: model_type {model_type!r} without routed experts is a dense model: it "
                f"has no experts to stream; Edge0 runs MoE checkpoints ({supported_list()})"
            )
        return fam.model_types[model_type]
    if model_type in _DENSE_TYPES or not _announces_experts(config):
        raise ModelLoadError(
            f"{where}: model_type {model_type!r} is a dense model: it has no experts to "
            f"stream; Edge0 runs MoE checkpoints of {supported_list()}"
        )
    raise ModelLoadError(
        f"{where}: model_type {model_type!r} is a Mixture-of-Experts family Edge0 does not "
        f"support yet; supported: {supported_list()} (docs/models.md: adding a family)"
    )


def _announces_experts(config: dict[str, Any]) -> bool:
    tc = text_config(config)
    return any(isinstance(tc.get(k), int) and tc[k] > 0 for k in _EXPERT_KEYS)


def family_of(config: dict[str, Any]) -> families.Family:
    """The family of a (supported) config."""
    return families.family_for(str(config.get("model_type")))


def sparse_layers(config: dict[str, Any]) -> list[int]:
    """Decoder layers with routed experts, by the family's rule."""
    return family_of(config).sparse_layers(text_config(normalize_config(config)))


def normalize_config(config: dict[str, Any]) -> dict[str, Any]:
    """Fill the fields mlx-lm expects from transformers-5 style configs (a new dict).

    First the config as transformers reads it, checked field by field
    (`edge0.model.fields.resolve`: ModelLoadError naming a refused field and value).
    Generic: `rope_parameters` -> `rope_theta` (and `rope_scaling` when not default),
    `head_dim`; then the family's own hook (e.g. Qwen: `num_local_experts` ->
    `num_experts`, `layer_types` -> `full_attention_interval`). Idempotent.
    """
    fam = families.FAMILIES.get(str(config.get("model_type")))
    # transformers' reading first: its defaults for absent keys, every audited field checked
    config = fields.resolve(config) if fam is not None else dict(config)
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = _normalize_text(dict(config["text_config"]), fam)
    else:
        config = _normalize_text(config, fam)
    return config


def _normalize_text(tc: dict[str, Any], fam: families.Family | None) -> dict[str, Any]:
    rope = tc.get("rope_parameters")
    if isinstance(rope, dict):
        tc.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        if "partial_rotary_factor" in rope:
            tc.setdefault("partial_rotary_factor", rope["partial_rotary_factor"])
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default" and (fam is None or fam.rope_scaling_key):
            tc.setdefault("rope_scaling", rope)
    if tc.get("head_dim") is None and "hidden_size" in tc and "num_attention_heads" in tc:
        tc["head_dim"] = tc["hidden_size"] // tc["num_attention_heads"]
    tc.setdefault("tie_word_embeddings", False)
    if "rope_traditional" in tc:  # mlx-lm's own key: transformers rotates halves whatever it says
        tc["rope_traditional"] = False
    return fam.normalize(tc) if fam is not None else tc


def model_classes(config: dict[str, Any], where: str = "config.json") -> tuple[Any, Any]:
    """(Model, ModelArgs) from mlx-lm for a supported config."""
    module = importlib.import_module(f"mlx_lm.models.{check_supported(config, where)}")
    return module.Model, module.ModelArgs


def instantiate(config: dict[str, Any], where: str = "config.json") -> nn.Module:
    """An mlx-lm model for a normalised config; weights are random until loaded."""
    model_cls, args_cls = model_classes(config, where)
    family = family_of(config)
    tc = {**text_config(config), "tie_word_embeddings": family.ties(config)}
    built = family.mlx_config(dict(tc))
    if isinstance(config.get("text_config"), dict):
        built = {**config, "text_config": built}
    try:
        model: nn.Module = model_cls(args_cls.from_dict(built))
        family.adapt(model, tc)
        if family.hidden_act:
            activations.install(model, str(tc.get("hidden_act", "silu")))
        rope.install(model, tc, traditional=family.interleaved_rope(tc))
        if tc["tie_word_embeddings"]:  # a head mlx-lm built anyway becomes the embedding
            attention.tie(model)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - mlx-lm's classes fail in many ways; one line
        line = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise ModelLoadError(
            f"{where}: config does not describe a valid {config.get('model_type')} model "
            f"({line}); compare config.json with the original model's (docs/models.md lists "
            "the values Edge0 runs)"
        ) from exc
    return model
