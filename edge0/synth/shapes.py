"""Model shapes of synthetic checkpoints and their config.json (transformers' config classes).

One `Shape` (the dimensions), built into a config by its family (`Family.shape_config`),
serves the named shapes of `edge0.synth.layout` (`SHAPES`: these and the families'
flagships, up to the 35B-A3B) and the tiny random HF checkpoints of `edge0.synth.tiny`
alike.
"""

from __future__ import annotations

from typing import Any

import attrs

from edge0.errors import ConversionError
from edge0.families import FAMILIES, Family, every_family
from edge0.synth.flagships import FLAGSHIPS, flagship_config

# the families that build synthetic shapes (`Family.shape_config`)
SHAPE_FAMILIES = tuple(
    f.name for f in every_family() if type(f).shape_config is not Family.shape_config
)


@attrs.frozen
class Shape:
    """The dimensions of a qwen3_moe / qwen3_5_moe model (qwen3_5_moe: every 4th layer is full
    attention, the rest Gated DeltaNet)."""

    model_type: str = "qwen3_5_moe"
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    experts: int = 8
    top_k: int = 2
    moe_ff: int = 32
    shared_ff: int = 32  # qwen3_5_moe only
    lin_k_heads: int = 2  # Gated DeltaNet (qwen3_5_moe only)
    lin_v_heads: int = 4
    lin_head_dim: int = 16


def hf_config(shape: Shape, vocab: int, **extra: Any) -> dict[str, Any]:
    """config.json of `shape` with `vocab` tokens; `extra` are more config fields (text config)."""
    family = FAMILIES.get(shape.model_type)
    if family is None or type(family).shape_config is Family.shape_config:
        raise ConversionError(
            f"synthetic checkpoints exist for {', '.join(SHAPE_FAMILIES)}, not {shape.model_type!r}"
        )
    return family.shape_config(shape, vocab, **extra)


_SMALL_35 = Shape(
    hidden=512,
    layers=8,
    heads=8,
    head_dim=64,
    experts=64,
    top_k=4,
    moe_ff=256,
    shared_ff=256,
    lin_k_heads=4,
    lin_v_heads=8,
    lin_head_dim=64,
)
# name -> (shape, vocabulary size); the 35B-A3B shapes are transformers' own defaults
NAMED: dict[str, tuple[Shape, int]] = {
    "tiny": (Shape(moe_ff=64, shared_ff=64), 512),
    "small": (_SMALL_35, 4096),
    "medium": (
        attrs.evolve(
            _SMALL_35,
            hidden=1024,
            layers=12,
            head_dim=128,
            experts=128,
            top_k=8,
            moe_ff=512,
            shared_ff=512,
        ),
        32768,
    ),
    "tiny-qwen3": (Shape(model_type="qwen3_moe", moe_ff=64), 512),
    "small-qwen3": (attrs.evolve(_SMALL_35, model_type="qwen3_moe"), 4096),
}


def shape_config(name: str) -> dict[str, Any]:
    """config.json of a named shape (SHAPES)."""
    if name in NAMED:
        shape, vocab = NAMED[name]
        return hf_config(shape, vocab)
    if name in FLAGSHIPS:  # the families' flagships (Family.flagships)
        return flagship_config(name)
    raise ConversionError(f"unknown shape {name!r}; choose one of {', '.join(SHAPES)}")


SHAPES = (*NAMED, *FLAGSHIPS)
