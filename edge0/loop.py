"""The event loop for blocking callers: `run` (asyncio.run with uvloop when installed)."""

from __future__ import annotations

import asyncio
from typing import Any


def loop_factory() -> Any:
    """uvloop's event loop factory when installed, else None (asyncio's default)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return None
    return uvloop.new_event_loop


def run(main: Any) -> Any:
    """asyncio.run with uvloop when installed."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
