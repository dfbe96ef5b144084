"""Helpers for the layout tests: tiny checkpoints, mlx-lm reference conversions, greedy decode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx

from edge0.model.arch import normalize_config
from edge0.synth.tiny import TinySpec, write_checkpoint

GROUP = 32  # the tiny expert width (32) needs group size 32


def tiny_hf(root: Path, model_type: str, shards: int = 1) -> Path:
    """A tiny random HF checkpoint (bf16) of `model_type` under root/hf-<type>."""
    return write_checkpoint(TinySpec(model_type=model_type), root / f"hf-{model_type}", shards)


def mlx_lm_int4(src: Path, dst: Path) -> Path:
    """mlx-lm's own int4 conversion of `src` (config normalised so mlx-lm can read it)."""
    from mlx_lm import convert

    staged = dst.with_name(dst.name + "-src")
    shutil.copytree(src, staged)
    config = json.loads((src / "config.json").read_text())
    (staged / "config.json").write_text(json.dumps(normalize_config(config)))
    convert(str(staged), str(dst), quantize=True, q_group_size=GROUP)
    shutil.rmtree(staged)
    return dst


def greedy(model: Any, prompt: list[int], n: int = 16) -> list[int]:
    """n greedy tokens after `prompt`, with mlx-lm's prompt cache."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    x = mx.array(prompt)[None]
    out = []
    for _ in range(n):
        token = int(mx.argmax(model(x, cache=cache)[0, -1]))
        out.append(token)
        x = mx.array([[token]])
    return out
