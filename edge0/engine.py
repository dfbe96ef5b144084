"""The public async API, `edge0.engine.Engine` and `SyncEngine`; built in edge0.runtime.engine."""

from edge0.runtime.engine.api import Engine, SyncEngine

__all__ = ["Engine", "SyncEngine"]
