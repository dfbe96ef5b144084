"""Blocking use of the engine: `SyncEngine`, a private event loop around `Engine`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edge0.loop import loop_factory
from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.summary import RunStats


class SyncEngine:
    """Blocking wrapper: `with SyncEngine(path, mode="route") as eng: for p in eng.generate(...)`.

    Runs a private event loop (uvloop when installed) only while a call is active.
    """

    def __init__(self, path: str | Path, **options: Any) -> None:
        self._runner = asyncio.Runner(loop_factory=loop_factory())
        self._cm = Engine.open(path, **options)
        try:
            self.engine: Engine = self._runner.run(self._cm.__aenter__())
        except BaseException:
            self._runner.close()
            raise

    def generate(self, prompt: str | list[int], **kw: Any) -> Iterator[str | RunStats]:
        agen: Any = self.engine.generate(prompt, **kw)
        try:
            while True:
                try:
                    yield self._runner.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._runner.run(agen.aclose())

    def close(self) -> None:
        self._runner.run(self._cm.__aexit__(None, None, None))
        self._runner.close()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
