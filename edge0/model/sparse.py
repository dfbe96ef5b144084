"""The sparse-MoE blocks of a model: mlx-lm's, or Edge0's streaming ones once installed."""

from __future__ import annotations

import mlx.nn as nn

from edge0.errors import ModelLoadError

SPARSE_ATTRS = ("mlp", "block_sparse_moe", "feed_forward")


def sparse_blocks(model: nn.Module) -> list[tuple[int, str, nn.Module]]:
    """(layer index, attribute name, block) for every layer with a routed-expert block."""
    from edge0.families import for_model

    switch = for_model(model).switch_attr
    out = []
    for i, layer in enumerate(model.layers):
        for attr in SPARSE_ATTRS:
            block = getattr(layer, attr, None) if attr in layer else None
            if block is not None and (switch in block or hasattr(block, "stream")):
                out.append((i, attr, block))
    if not out:
        raise ModelLoadError("the model has no sparse MoE layers; Edge0 streams MoE models")
    return out
