"""Shared by the examples: the model directory (argv[1], else a tiny demo model, layout form)."""

from __future__ import annotations

import sys
from pathlib import Path


def model_dir() -> Path:
    """argv[1] when given; else the demo model converted once to the edge0 layout."""
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    from edge0.layout.convert import ConvertOptions, convert
    from edge0.model.demo import cache_dir, default_model_path

    out = cache_dir() / "tiny-qwen3_5_moe-v1-edge0"
    if not (out / "edge0.json").is_file():
        convert(default_model_path(), out, ConvertOptions(group_size=32))
    return out
