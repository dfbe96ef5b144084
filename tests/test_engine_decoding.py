"""A solo request decodes its steps back to back on the compute thread: the same tokens and stats
as feeding the runner one step at a time, and it stops where the per-step worker stopped (EOS,
max_tokens, a cancelled consumer, a closing engine)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from runtime_helpers import PROMPT, MockTier, build_store

from edge0.model.generate import Sampler, SamplingSettings
from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.decoding import Decoding
from edge0.runtime.engine.requests import Request
from edge0.runtime.engine.solo import prefill
from edge0.runtime.engine.summary import RunStats

N = 12


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("decoding"), "qwen3_moe", layers=4)


def _step_by_step(eng: Engine, settings: SamplingSettings, n: int) -> list[int]:
    """The tokens of feeding the runner one step at a time (the worker's old way)."""

    def run() -> list[int]:
        runner = eng.setup.make_runner(10_000, Sampler(settings), settings)
        tok = prefill(runner, PROMPT, decode=True)  # the engine's prompt path
        out = [tok]
        for i in range(n - 1):
            tok = runner.feed(tok, False, i < n - 2)
            out.append(tok)
        runner.finish()
        return out

    return eng._compute.submit(run).result()


@pytest.mark.parametrize("mode", ["resident", "route", "hint"])
@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_tokens_and_stats_equal_step_by_step_feeding(store: Path, mode: str, temp: float) -> None:
    settings = SamplingSettings(temp=temp, seed=3)

    async def main() -> tuple[list[int], list[int], RunStats]:
        async with Engine.open(store, tiers=MockTier(store), mode=mode) as eng:
            got = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False, sampling=settings)]
            stats = eng.last_stats
            assert stats is not None
            ref = await asyncio.to_thread(_step_by_step, eng, settings, N)
            return got, ref, stats

    got, ref, stats = asyncio.run(main())
    assert got == ref
    assert stats.generated_tokens == N and stats.finish_reason == "length"
    assert stats.decode_steps == N - 1  # the first token is the prompt's


class Scripted:
    """A runner whose steps return the next scripted token, each taking `delay` seconds."""

    def __init__(self, script: list[int], delay: float = 0.0) -> None:
        self.script = list(script)
        self.fed: list[tuple[int, bool]] = []
        self.delay = delay

    def feed(self, token: int, prefill: bool, prefetch: bool = True) -> int:
        self.fed.append((token, prefetch))
        time.sleep(self.delay)
        return self.script.pop(0)


def _decode(
    script: list[int],
    first: int,
    max_tokens: int,
    eos: frozenset[int] = frozenset(),
    cancel_after: int | None = None,
    delay: float = 0.0,
) -> tuple[list[int], RunStats, Scripted]:
    async def main() -> tuple[list[int], RunStats, Scripted]:
        req = Request(0, [1], max_tokens, SamplingSettings(), eos)
        stats = RunStats(mode="resident")
        stats.finish_reason = "cancelled"
        runner = Scripted(script, delay)
        dec = Decoding(req, stats, time.perf_counter())
        dec.take(first, step=False)
        got: list[int] = []

        async def consume() -> None:
            async for t in req.stream():
                got.append(t)
                if cancel_after is not None and len(got) >= cancel_after:
                    break

        consumer = asyncio.create_task(consume())
        if not dec.done:
            loop = asyncio.get_running_loop()
            done = asyncio.Event()

            def job() -> None:
                try:
                    dec.steps(runner, first, loop)
                finally:
                    loop.call_soon_threadsafe(done.set)

            threading.Thread(target=job).start()
            await done.wait()
        req.finish()
        await consumer
        return got, stats, runner

    return asyncio.run(main())


def test_max_tokens_ends_it_and_the_last_step_does_not_prefetch() -> None:
    got, stats, runner = _decode([11, 12, 13, 14, 15], first=10, max_tokens=4)
    assert got == [10, 11, 12, 13]
    assert (stats.generated_tokens, stats.decode_steps, stats.finish_reason) == (4, 3, "length")
    assert [p for _, p in runner.fed] == [True, True, False]
    assert [t for t, _ in runner.fed] == [10, 11, 12]


def test_eos_ends_it_uncounted() -> None:
    got, stats, runner = _decode([11, 0, 13], first=10, max_tokens=9, eos=frozenset({0}))
    assert got == [10, 11]
    assert (stats.generated_tokens, stats.decode_steps, stats.finish_reason) == (2, 2, "stop")
    assert len(runner.fed) == 2  # no step after EOS


def test_a_first_token_that_ends_it_runs_no_step() -> None:
    got, stats, runner = _decode([11], first=0, max_tokens=9, eos=frozenset({0}))
    assert got == [] and runner.fed == [] and stats.finish_reason == "stop"
    got, stats, runner = _decode([11], first=10, max_tokens=1)
    assert got == [10] and runner.fed == [] and stats.finish_reason == "length"


def test_a_cancelled_consumer_stops_it_after_the_step_in_flight() -> None:
    script = list(range(100, 160))
    got, stats, runner = _decode(script, first=10, max_tokens=50, cancel_after=2, delay=0.01)
    assert got == [10, 100]  # the consumer took two and went away
    assert stats.finish_reason == "cancelled"
    assert stats.generated_tokens <= 3  # the tokens taken, plus the step that was in flight
    assert len(runner.fed) <= 3


def test_a_closing_engine_stops_the_steps(store: Path) -> None:
    async def main() -> tuple[float, list[int]]:
        got: list[int] = []
        async with Engine.open(store, tiers=MockTier(store), mode="resident") as eng:

            async def client() -> None:
                async for t in eng.tokens(PROMPT, max_tokens=100_000, stop=False):
                    got.append(t)

            task = asyncio.create_task(client())
            while len(got) < 3:
                await asyncio.sleep(0.005)
            t0 = time.perf_counter()
        took = time.perf_counter() - t0  # the engine closed with the request decoding
        await asyncio.gather(task, return_exceptions=True)
        return took, got

    took, got = asyncio.run(main())
    assert len(got) >= 3
    assert took < 10  # the compute thread stopped after its step, not after 100,000
