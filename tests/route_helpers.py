"""What the route-mode graph tests share: a store whose heads are random in every part, and a
graph's node count."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
from runtime_helpers import build_store

import edge0.model.loader
from edge0.routing.prerouter import PrerouterSet
from edge0.routing.prerouter_heads import PrerouterHead


def perturbed_heads(model: Any, seed: int = 0) -> PrerouterSet:
    """Full heads whose every part is random (an untrained head ignores the sets)."""
    heads = PrerouterSet.from_model(model, hidden=16)
    rng = np.random.default_rng(seed)
    for head in heads.heads.values():
        assert isinstance(head, PrerouterHead)
        for lin in (head.fc1, head.fc2, head.lin_m):
            lin.weight = mx.array(rng.normal(0, 0.5, lin.weight.shape).astype(np.float32))
    heads.config = attrs.evolve(heads.config, trained=True)
    return heads


def store_with_random_heads(where: Path) -> Path:
    """A 4-layer Qwen3-MoE store under `where` with `perturbed_heads` saved beside it."""
    path = build_store(where, "qwen3_moe", layers=4)
    perturbed_heads(edge0.model.loader.load(path).model).save(path)
    return path


def graph_nodes(out: mx.array) -> int:
    """The nodes of the graph that computes `out` (MLX's dot export)."""
    buf = io.StringIO()
    mx.export_to_dot(buf, out)
    return len(re.findall(r'label ="', buf.getvalue()))
