"""Prerouter heads' configuration (prerouter.json): shape, horizon, provenance, file names."""

from __future__ import annotations

from typing import Any

import attrs

from edge0.errors import CheckpointError

WEIGHTS_FILE = "prerouter.safetensors"
CONFIG_FILE = "prerouter.json"
FORMAT_VERSION = 1
# Horizon of a set of heads: "token" (the next MoE layer at token t+1, what route mode runs
# on) or "layer" (the next MoE layer at the same token t: one layer of lead time). Each
# horizon has its own files, so layer heads never replace the shipped token heads.
HORIZONS = ("token", "layer")
FILES = {
    "token": (WEIGHTS_FILE, CONFIG_FILE),
    "layer": ("prerouter-layer.safetensors", "prerouter-layer.json"),
}


@attrs.frozen
class PrerouterConfig:
    """Shape and provenance of a set of heads (stored as prerouter.json)."""

    d_model: int
    num_experts: int
    top_k: int  # the model's own top-k
    hidden: int  # width of fc1 (paper: 512 for d_model 2048)
    moe_layers: tuple[int, ...]  # model layer indices with a sparse block, ascending
    wrap: bool = True  # the last MoE layer's head predicts the first MoE layer at t+1
    trained: bool = False
    horizon: str = "token"  # one of HORIZONS; "layer" heads never wrap
    router_bias: bool = False  # the heads' router copy has the router's bias
    info: dict[str, Any] = attrs.field(factory=dict)  # training provenance and figures

    def heads(self) -> list[tuple[int, int]]:
        """(owner layer N, target layer) pairs; the target is routed at token t+1 (horizon
        "token") or at the same token t (horizon "layer")."""
        pairs = list(zip(self.moe_layers[:-1], self.moe_layers[1:], strict=True))
        if self.wrap and self.moe_layers:
            pairs.append((self.moe_layers[-1], self.moe_layers[0]))
        return pairs

    def to_json(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["moe_layers"] = list(self.moe_layers)
        d["format_version"] = FORMAT_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PrerouterConfig:
        d = dict(d)
        version = d.pop("format_version", None)
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"{CONFIG_FILE}: format_version {version!r} is not {FORMAT_VERSION}; "
                "retrain the heads with `edge0 train heads`"
            )
        d["moe_layers"] = tuple(d["moe_layers"])
        horizon = d.get("horizon", "token")
        if horizon not in HORIZONS or (horizon == "layer" and d.get("wrap", True)):
            raise CheckpointError(
                f"{CONFIG_FILE}: horizon {horizon!r} (wrap {d.get('wrap', True)}) is not one of "
                f"{list(HORIZONS)} (layer heads do not wrap); retrain the heads"
            )
        return cls(**d)


def default_hidden(d_model: int) -> int:
    """Paper ratio (512 for d_model 2048), at least 32."""
    return max(32, d_model // 4)
