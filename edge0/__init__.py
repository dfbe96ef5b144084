"""Edge0: stream the experts of a Mixture-of-Experts model from disk, on MLX."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge0.errors import Edge0Error

if TYPE_CHECKING:
    from edge0.model.generate import generate
    from edge0.model.loader import LoadedModel, load
    from edge0.runtime.engine.api import Engine
    from edge0.runtime.engine.sync import SyncEngine

__version__ = "0.1.0"

__all__ = [
    "Edge0Error",
    "Engine",
    "LoadedModel",
    "SyncEngine",
    "__version__",
    "generate",
    "load",
]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `import edge0.errors` stays light (no MLX import).
    if name in ("load", "LoadedModel"):
        from edge0.model import loader

        return getattr(loader, name)
    if name == "Engine":
        from edge0.runtime.engine.api import Engine

        return Engine
    if name == "SyncEngine":
        from edge0.runtime.engine.sync import SyncEngine

        return SyncEngine
    if name == "generate":
        from edge0.model.generate import generate

        return generate
    raise AttributeError(f"module 'edge0' has no attribute {name!r}")
