"""What the worker paths (`solo`, `batcher`) use of the Engine that runs them (`api.Engine`)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from edge0.options.engine import EngineOptions
from edge0.runtime.compute.thread import ComputeThread
from edge0.runtime.engine.requests import Request
from edge0.runtime.engine.summary import RunStats
from edge0.runtime.setup.build import Setup


class Host(Protocol):
    """An engine as its worker sees it: its parts, its queue, and where a request's stats go."""

    setup: Setup
    options: EngineOptions
    last_stats: RunStats | None
    _compute: ComputeThread
    _pending: asyncio.Queue[Request]
    _idle: asyncio.Event
    _lags: list[float]  # the event loop's lag samples of the request running
