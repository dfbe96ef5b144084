"""Helpers for the server tests: a live uvicorn server in a thread on 127.0.0.1, the demo model.

`LiveServer` runs `edge0.server.app` exactly as `edge0 serve` does (uvicorn, the
engine opened in the server's lifespan, its own event loop), on a free loopback
port, in a thread of the test process, so tests can hand it a Tier object.
`FlakyTier` wraps a real tier stack and fails reads on request.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import anthropic
import attrs
import openai
import pytest

from edge0 import log
from edge0.cli.serve import listen
from edge0.errors import TierReadError
from edge0.layout.manifest import Manifest
from edge0.server.app import ServerConfig, create_app
from edge0.server.connections import uvicorn_config
from edge0.server.drain import DrainingServer
from edge0.storage.spec import open_tiers
from edge0.storage.tier import ExpertKey, ReadInfo

log.configure("warning")
KEY = "test-key-0123"
TIERS = "ram:64MiB>pread"


def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo student in the session's EDGE0_CACHE (the path conftest.py sets)."""
    from edge0.model.demo import default_model_path

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE0_CACHE", str(tmp_path_factory.getbasetemp() / "edge0-cache"))
        return default_model_path()


class FlakyTier:
    """A real tier stack whose reads raise TierReadError while `failing` (or after
    `fail_after` more reads)."""

    name = "flaky"

    def __init__(self, path: Path, spec: str = TIERS) -> None:
        self.inner = open_tiers(spec, path, Manifest.load(path))
        self.failing = False
        self.fail_after: int | None = None

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        if self.fail_after is not None:
            self.fail_after -= 1
            self.failing = self.failing or self.fail_after < 0
        if self.failing:
            raise TierReadError("injected fault", file="flaky", layer=key.layer, expert=key.expert)
        return await self.inner.read_into(key, dest)

    async def aclose(self) -> None:
        await self.inner.aclose()


class LiveServer:
    """`with LiveServer(config) as url:` serves `config` at `url` until the block ends."""

    def __init__(self, config: ServerConfig, grace: float = 2.0) -> None:
        self.ready = threading.Event()
        self.config = attrs.evolve(config, on_ready=lambda _: self.ready.set())
        self.app: Any = create_app(self.config)
        self.sock = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = DrainingServer(
            uvicorn_config(self.app, self.config.limits, self.app.state.metrics),
            self.config.drain,
            grace,
        )
        self.thread = threading.Thread(target=self._run, name="test-uvicorn", daemon=True)
        self.clients: list[Any] = []  # SDK clients to close at the end (their pooled sockets)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def __enter__(self) -> str:
        self.thread.start()
        while not (self.ready.wait(0.1) and self.server.started):  # started: it listens
            error = getattr(self.app.state, "startup_error", None)
            if error is not None or not self.thread.is_alive():
                raise RuntimeError(f"the server did not start: {error!r}")
        return self.url

    def __exit__(self, *exc: object) -> None:
        for client in self.clients:
            client.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        assert not self.thread.is_alive(), "the server did not stop"

    @property
    def backend(self) -> Any:
        return self.app.state.backend

    def openai(self, **kw: Any) -> openai.OpenAI:
        """An OpenAI SDK client of this server (closed with the server)."""
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, **kw)
        self.clients.append(client)
        return client

    def anthropic(self, **kw: Any) -> anthropic.Anthropic:
        """An Anthropic SDK client of this server (closed with the server)."""
        client = anthropic.Anthropic(base_url=self.url, api_key=KEY, max_retries=0, **kw)
        self.clients.append(client)
        return client
