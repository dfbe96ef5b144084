"""The public async API, `edge0.engine.Engine` and `SyncEngine`; built in edge0.runtime.engine."""

from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.sync import SyncEngine

__all__ = ["Engine", "SyncEngine"]
