"""A layout's prerouter heads opened as a run opens them (`edge0 verify`): both files of each
horizon, loaded by `PrerouterSet.load`, and their shape against the model's."""

from __future__ import annotations

import os
from pathlib import Path

from edge0.errors import CheckpointError
from edge0.routing.prerouter import FILES, HORIZONS, PrerouterSet

_FIX = "re-run `edge0 convert`, or retrain the heads (`edge0 tune`)"


def check_heads(
    layout: Path, moe_layers: tuple[int, ...], n_experts: int, d_model: int
) -> list[str]:
    """Open every horizon's heads in `layout` that has a file there; a CheckpointError names
    the file when a run would refuse it, or when the heads do not fit the model. Returns the
    horizons checked."""
    checked = []
    for horizon in HORIZONS:
        names = FILES[horizon]
        present = [n for n in names if os.path.lexists(layout / n)]
        if not present:
            continue
        if len(present) < len(names):
            (missing,) = set(names) - set(present)
            raise CheckpointError(
                f"{layout / present[0]} is there but {layout / missing} is missing; {_FIX}"
            )
        config = PrerouterSet.load(layout, horizon).config
        shape = (config.moe_layers, config.num_experts, config.d_model)
        if shape != (moe_layers, n_experts, d_model):
            raise CheckpointError(
                f"{layout / names[1]}: heads for MoE layers {list(config.moe_layers)}, "
                f"E={config.num_experts}, d={config.d_model}; the model has "
                f"{list(moe_layers)}, E={n_experts}, d={d_model}; {_FIX}"
            )
        checked.append(horizon)
    return checked
