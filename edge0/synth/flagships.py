"""Full-size shapes of each family's flagship models (config.json as released checkpoints have it).

Each family module declares its flagships (`Family.flagships`: the published configs'
architecture fields, built with transformers' config classes); edge0.synth.layout's
`plan_sizes` gives a shape's resident and expert bytes in the edge0 layout without
writing anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edge0.families import Family, every_family


def _owners() -> dict[str, Family]:
    return {name: f for f in every_family() for name in f.own("flagships")}


# flagship name -> the family whose module declares it
OWNERS: dict[str, Family] = _owners()
FLAGSHIPS: dict[str, Callable[[], Any]] = {n: f.own("flagships")[n] for n, f in OWNERS.items()}


def expert_params(shape: str, bits: int, group_size: int) -> dict[str, Any]:
    """The experts' quantization of a shape: MXFP4 where its checkpoint has it, else affine."""
    if shape in OWNERS and OWNERS[shape].expert_mode == "mxfp4":
        return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    return {"group_size": group_size, "bits": bits, "mode": "affine"}


def expert_spec(model: Any, params: dict[str, Any]) -> Any:
    """(switch layers, E, record layout) of a float-shaped model's experts.

    Affine `params` gain the projections mlx-lm's predicate quantizes otherwise (in place).
    """
    from edge0.layout.quant import expert_projections, switch_modules
    from edge0.layout.records import record_layout

    if params["mode"] == "affine" and (own := expert_projections(model, params)):
        params["projections"] = own
    switch = switch_modules(model)
    first = switch[next(iter(switch))][1]
    n_experts, d_ff, d_model = first.gate_proj.weight.shape
    bias = "bfloat16" if "bias" in first.gate_proj else None  # gpt-oss
    scales = "uint8" if params["mode"] == "mxfp4" else "bfloat16"
    spec = record_layout(
        d_model,
        d_ff,
        params["bits"],
        params["group_size"],
        scales,
        params["mode"],
        bias,
        params.get("projections"),
    )
    return tuple(switch), int(n_experts), spec


def flagship_config(name: str) -> dict[str, Any]:
    """config.json of a flagship, under its family's model_type (kimi-k2: kimi_k2)."""
    built = FLAGSHIPS[name]()
    out: dict[str, Any] = built if isinstance(built, dict) else built.to_dict()
    out["model_type"] = OWNERS[name].name
    return out
