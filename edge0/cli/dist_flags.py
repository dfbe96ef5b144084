"""`edge0 run --hosts/--layers/--rank-timeout`: the pipeline's options, resolved for the engine."""

from __future__ import annotations

from typing import Any

from edge0.ranks.hosts import LAUNCHED, launched_rank

DIST_KEYS = ("hosts", "layers", "rank_timeout")


def resolve(engine: dict[str, Any]) -> dict[str, Any]:
    """`engine` (Engine.open's keywords) with the pipeline options resolved: hosts=LAUNCHED
    under mlx.launch, and no pipeline options at all when there is no pipeline."""
    hosts = engine.get("hosts")
    if hosts is None and launched_rank() is not None:
        hosts = LAUNCHED
    rest = {k: v for k, v in engine.items() if k not in DIST_KEYS}
    if hosts is None:
        return rest
    return rest | {k: engine[k] for k in DIST_KEYS if k in engine} | {"hosts": hosts}
