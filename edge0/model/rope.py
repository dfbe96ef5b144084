"""YaRN with `truncate: false`: the correction range unrounded, as transformers computes it.

mlx-lm's YarnRoPE always rounds the correction range (floor / ceil, transformers'
`truncate: true`); the released gpt-oss configs say `truncate: false`. After the model
is built, `untruncate_yarn` recomputes the frequencies of every YarnRoPE in it from the
config's rope parameters without the rounding (transformers' arithmetic, in float32).
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn


def untruncate_yarn(model: nn.Module, tc: dict[str, Any]) -> int:
    """Give every YarnRoPE of `model` the unrounded range when the config says so; count them."""
    from mlx_lm.models.rope_utils import YarnRoPE

    rope = tc.get("rope_parameters") or tc.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type"))
    if kind != "yarn" or rope.get("truncate", True):
        return 0
    n = 0
    for _, module in model.named_modules():
        if isinstance(module, YarnRoPE):
            module._freqs = yarn_periods(module.dims, float(rope.get("rope_theta", 10000.0)), rope)
            n += 1
    return n


def yarn_periods(dims: int, base: float, rope: dict[str, Any]) -> mx.array:
    """mlx-lm's `_freqs` (periods per rotated pair) of YaRN without rounding the range."""
    factor = float(rope["factor"])
    original = float(rope.get("original_max_position_embeddings", 4096))

    def correction_dim(rotations: float) -> float:
        return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(correction_dim(float(rope.get("beta_fast", 32))), 0.0)
    high = min(correction_dim(float(rope.get("beta_slow", 1))), dims - 1.0)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    extrapolation = 1.0 - ramp  # 1: keep the original frequency, 0: interpolate
    period = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    inv = extrapolation / period + (1 - extrapolation) / (factor * period)
    return 1.0 / inv
