"""A request cancelled inside a long prompt stops within a second, not at the chunk's end.

The engine's cancel (a consumer that goes away: a client disconnect, Ctrl-C) marks the
request; a chunked prompt reads that flag between layers, expert groups and recurrent
pieces (edge0.runtime.prefill.chunks.ChunkState.check). Here one chunk of a tiny model
is made slow by a tier whose every read takes 0.2 s: uncancelled it runs for seconds.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import MODEL_TYPES
from runtime_helpers import MockTier, build_store

from edge0.runtime.engine.api import Engine

PROMPT = [(7 * i + 3) % 200 + 5 for i in range(200)]
DELAY = 0.2  # seconds a read takes


@pytest.fixture(scope="module", params=MODEL_TYPES)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("prefill-cancel"), request.param)


async def _prompt(eng: Engine, cancel_after: float | None) -> tuple[float, int]:
    """Run PROMPT as one chunk; cancel its consumer after `cancel_after` s. Returns the seconds
    from the cancel (or the start) to the engine being idle, and the tokens it yielded."""
    got: list[int] = []

    async def consume() -> None:
        async for tok in eng.tokens(PROMPT, max_tokens=1, stop=False):  # the prompt alone
            got.append(tok)

    task = asyncio.create_task(consume())
    t0 = time.perf_counter()
    if cancel_after is not None:
        await asyncio.sleep(cancel_after)
        assert not task.done(), "the prompt ended before the cancel: make it slower"
        task.cancel()
        t0 = time.perf_counter()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.wait_for(eng.wait_idle(), 30)
    return time.perf_counter() - t0, len(got)


@pytest.fixture(scope="module")
def uncancelled(store: Path) -> tuple[float, int]:
    """How long the slow chunk takes when nobody cancels it, and how many reads it makes."""

    async def go() -> tuple[float, int]:
        tier = MockTier(store, delay=DELAY)
        opts: dict[str, Any] = {"mode": "reactive", "prefill_chunk": len(PROMPT)}
        async with Engine.open(store, tiers=tier, **opts) as eng:
            whole, n = await _prompt(eng, None)
            assert n == 1
        return whole, len(tier.reads)

    return asyncio.run(go())


@pytest.mark.parametrize("max_batch", [1, 2])
def test_a_cancelled_prompt_stops_inside_its_chunk(
    store: Path, uncancelled: tuple[float, int], max_batch: int
) -> None:
    whole, reads = uncancelled
    assert whole > 2.0, f"the uncancelled prompt took {whole:.2f}s: too fast to tell"

    async def go() -> tuple[Any, ...]:
        tier = MockTier(store, delay=DELAY)
        opts: dict[str, Any] = {"mode": "reactive", "prefill_chunk": len(PROMPT)}
        async with Engine.open(store, tiers=tier, max_batch=max_batch, **opts) as eng:
            stop, n = await _prompt(eng, 0.5)
            stats = eng.last_stats if max_batch == 1 else None
        return stop, n, len(tier.reads), stats

    stop, n, cancelled_reads, stats = asyncio.run(go())
    assert n == 0  # no token: the prompt never finished
    assert stop < 1.0, f"{stop:.2f}s from the cancel to an idle engine"
    assert cancelled_reads < reads * 0.75  # it stopped inside the chunk, not at its end
    if stats is not None:
        assert stats.finish_reason == "cancelled"


def test_the_engine_serves_the_next_request_after_a_cancel(store: Path) -> None:
    """The pool, the fence and the queued reads are left clean: the next prompt's tokens
    are those of an engine that never saw the cancelled one."""

    async def go() -> tuple[list[int], list[int]]:
        opts: dict[str, Any] = {"mode": "reactive", "prefill_chunk": 64}
        async with Engine.open(store, tiers=MockTier(store), **opts) as eng:
            fresh = [t async for t in eng.tokens(PROMPT[:80], max_tokens=5, stop=False)]
        slow = MockTier(store, delay=DELAY)
        async with Engine.open(store, tiers=slow, **opts) as eng:
            await _prompt(eng, 0.5)
            slow.delay = 0.0  # the engine is idle: the next prompt needs no slow reads
            after = [t async for t in eng.tokens(PROMPT[:80], max_tokens=5, stop=False)]
        return fresh, after

    fresh, after = asyncio.run(go())
    assert after == fresh
