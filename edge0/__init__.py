"""Edge0: stream the experts of a Mixture-of-Experts model from disk, on MLX."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge0.errors import Edge0Error

if TYPE_CHECKING:
    from edge0.engine import Engine, SyncEngine
    from edge0.loader import LoadedModel, load

__version__ = "0.1.0"

__all__ = ["Edge0Error", "Engine", "LoadedModel", "SyncEngine", "__version__", "load"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `import edge0.errors` stays light (no MLX import).
    if name in ("load", "LoadedModel"):
        from edge0 import loader

        return getattr(loader, name)
    if name in ("Engine", "SyncEngine"):
        from edge0 import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'edge0' has no attribute {name!r}")
