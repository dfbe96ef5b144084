"""The float-shaped mlx-lm model of a config, for planning conversions and loading layouts."""

from __future__ import annotations

from typing import Any

import mlx.nn as nn

from edge0.model import arch as models

QUANT_KEYS = ("quantization", "quantization_config")


def float_config(config: dict[str, Any]) -> dict[str, Any]:
    """The normalised config without its quantization entries."""
    return models.normalize_config({k: v for k, v in config.items() if k not in QUANT_KEYS})


def build_float_model(config: dict[str, Any]) -> nn.Module:
    """The mlx-lm model for `config` with every layer in float (lazy random init, unloaded)."""
    return models.instantiate(float_config(config))
