"""Test helpers for the tier tests: a tiny synthetic store, plain reads, fault-injecting tiers."""

from __future__ import annotations

import asyncio
import errno
import heapq
import itertools
from pathlib import Path

from edge0.errors import TierReadError
from edge0.layout.manifest import EXPERTS_FILE, Manifest
from edge0.storage.tier import ExpertKey, ReadInfo, Tier
from edge0.synth.store import write_store


def tiny_store(directory: Path) -> Manifest:
    return write_store(directory, n_layers=3, n_experts=4, d_model=64, d_ff=32, seed=7)


def all_keys(manifest: Manifest) -> list[ExpertKey]:
    return [ExpertKey(layer, e) for layer in manifest.moe_layers for e in range(manifest.n_experts)]


def plain_read(directory: Path, manifest: Manifest, key: ExpertKey) -> bytes:
    with open(Path(directory) / EXPERTS_FILE, "rb") as f:
        f.seek(manifest.record_offset(key.layer, key.expert))
        return f.read(manifest.record_size)


class FaultyTier:
    """Wraps a tier; the first `failures` reads raise TierReadError (or `exc`) or hang on `gate`."""

    name = "faulty"

    def __init__(self, inner: Tier, failures: int = 0, gate: asyncio.Event | None = None):
        self.inner = inner
        self.failures = failures
        self.gate = gate
        self.reads = 0

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.failures > 0:
            self.failures -= 1
            raise TierReadError("injected", layer=key.layer, expert=key.expert)
        return await self.inner.read_into(key, dest)

    async def aclose(self) -> None:
        await self.inner.aclose()


def eio() -> OSError:
    return OSError(errno.EIO, "Input/output error")


class FakeClock:
    """Virtual time for asyncio tests: `sleep` waits until `run_until_idle` advances the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._tick = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), next(self._tick), fut))
        await fut

    async def run(self, *coros):  # type: ignore[no-untyped-def]
        """Run coroutines to completion, advancing virtual time whenever all are blocked."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        while not all(t.done() for t in tasks):
            for _ in range(50):  # let every runnable task reach its next await
                await asyncio.sleep(0)
            if self._timers and not all(t.done() for t in tasks):
                when, _, fut = heapq.heappop(self._timers)
                self.now = max(self.now, when)
                fut.set_result(None)
        return [t.result() for t in tasks]
