"""Request flow: no consumer (kept, stopped, collected, cancelled, many) can hold the engine."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PROMPT, MockTier

from edge0.errors import TierReadError
from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.summary import RunStats
from edge0.storage.tier import ExpertKey

LIMIT_S = 60.0  # a hang fails the test instead of stalling the suite
PROMPTS = ["alpha", "beta gamma", "delta", "epsilon zeta eta"]


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_5_moe"]  # the session's read-only store (conftest.py)


async def text_of(eng: Engine, prompt: Any, n: int = 8) -> str:
    pieces = [p async for p in eng.generate(prompt, max_tokens=n)]
    assert isinstance(pieces[-1], RunStats)
    return "".join(p for p in pieces if isinstance(p, str))


async def ids_of(eng: Engine, n: int = 6) -> list[int]:
    return [t async for t in eng.tokens(PROMPT, max_tokens=n, stop=False)]


def run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main, LIMIT_S))


def test_a_kept_generator_that_was_left_does_not_block_later_requests(store: Path) -> None:
    async def main() -> tuple[list[int], list[int], str, list[int]]:
        async with Engine.open(store, mode="route", tiers=MockTier(store)) as eng:
            ref = await ids_of(eng)
            kept = eng.tokens(PROMPT, max_tokens=40, stop=False)
            first = [await kept.__anext__()]  # then the caller walks away, keeping `kept`
            again = await ids_of(eng)  # hung forever when the lock was held across yield
            # the kept one still has every token it generated
            rest = [t async for t in kept]
            reason = eng.last_stats.finish_reason if eng.last_stats else ""
            return ref, again, reason, first + rest

    ref, again, reason, kept = run(main())
    assert again == ref
    assert len(kept) == 40 and kept[:6] == ref
    assert reason == "length"


def test_a_consumer_that_stops_pulling_delays_only_itself(store: Path) -> None:
    async def main() -> tuple[str, str, list[str], tuple[str, str]]:
        async with Engine.open(store, mode="hint", tiers=MockTier(store, delay=0.001)) as eng:
            ref_slow, ref_fast = await text_of(eng, "slow", 12), await text_of(eng, "fast", 12)
            resume = asyncio.Event()
            order: list[str] = []

            async def stalled() -> str:
                pieces = []
                async for p in eng.generate("slow", max_tokens=12):
                    if isinstance(p, str):
                        pieces.append(p)
                        if len(pieces) == 1:
                            await resume.wait()  # stops pulling until the fast one is done
                order.append("slow")
                return "".join(pieces)

            async def fast() -> str:
                text = await text_of(eng, "fast", 12)
                order.append("fast")
                resume.set()
                return text

            slow_task = asyncio.create_task(stalled())
            await asyncio.sleep(0)
            got_fast = await fast()
            got_slow = await slow_task
            return ref_slow, got_slow, order, (got_fast, ref_fast)

    ref_slow, got_slow, order, (got_fast, ref_fast) = run(main())
    assert order == ["fast", "slow"]  # the fast client finished while the slow one slept
    assert got_fast == ref_fast and got_slow == ref_slow


def test_a_garbage_collected_generator_cancels_its_request(store: Path) -> None:
    async def main() -> tuple[list[int], list[int], str]:
        async with Engine.open(store, mode="reactive", tiers=MockTier(store)) as eng:
            ref = await ids_of(eng)
            gen = eng.tokens(PROMPT, max_tokens=10_000, stop=False)
            await gen.__anext__()
            del gen
            gc.collect()  # asyncio finalizes it (aclose) on the loop
            again = await ids_of(eng)
            stats = [eng.last_stats]
            return ref, again, str(stats[0].finish_reason if stats[0] else "")

    ref, again, _ = run(main())
    assert again == ref


def test_cancelled_and_closed_streams_end_their_request_after_one_step(store: Path) -> None:
    async def main() -> tuple[list[int], list[int], list[str], list[int]]:
        reasons: list[str] = []
        steps: list[int] = []
        async with Engine.open(store, mode="route", tiers=MockTier(store)) as eng:
            ref = await ids_of(eng)
            async with contextlib.aclosing(eng.tokens(PROMPT, max_tokens=500, stop=False)) as it:
                async for _ in it:
                    break
            await eng.wait_idle()
            assert eng.last_stats is not None
            reasons.append(eng.last_stats.finish_reason)
            steps.append(eng.last_stats.generated_tokens)
            first = eng.last_stats
            got: list[Any] = []

            async def client() -> None:
                async for p in eng.generate("a long one", max_tokens=500):
                    got.append(p)

            task = asyncio.create_task(client())
            while not got:
                await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await eng.wait_idle()
            assert eng.last_stats is not first
            reasons.append(eng.last_stats.finish_reason)
            again = await ids_of(eng)
        return ref, again, reasons, steps

    ref, again, reasons, steps = run(main())
    assert again == ref
    assert reasons == ["cancelled", "cancelled"]
    assert steps[0] <= 2  # the token taken, plus at most the step that was in flight


def test_four_concurrent_clients_each_get_their_solo_text(store: Path) -> None:
    async def main() -> tuple[list[str], list[str], list[int]]:
        async with Engine.open(store, mode="route", tiers=MockTier(store, delay=0.001)) as eng:
            solo = [await text_of(eng, p, 10) for p in PROMPTS]
            done: list[int] = []

            async def client(i: int) -> str:
                text = await text_of(eng, PROMPTS[i], 10)
                done.append(i)
                return text

            async def quitter() -> None:  # a fifth client that leaves after one piece
                gen = eng.generate("quit early", max_tokens=200)
                await gen.__anext__()

            tasks = [asyncio.create_task(client(i)) for i in range(2)]
            tasks.append(asyncio.create_task(quitter()))  # type: ignore[arg-type]
            tasks += [asyncio.create_task(client(i)) for i in range(2, 4)]
            got = await asyncio.gather(*tasks)
            return solo, [g for g in got if g is not None], done

    solo, got, done = run(main())
    assert got == solo
    assert sorted(done) == [0, 1, 2, 3]


def test_a_failed_request_among_concurrent_ones_leaves_the_others_whole(store: Path) -> None:
    from edge0.layout.manifest import Manifest

    layer = Manifest.load(store).moe_layers[1]
    fail = {ExpertKey(layer, e) for e in range(64)}

    async def main() -> tuple[list[str], list[Any]]:
        async with Engine.open(store, mode="reactive", tiers=MockTier(store)) as eng:
            solo = [await text_of(eng, p, 6) for p in PROMPTS[:2]]
        tier = MockTier(store, fail=fail, faults=1)
        async with Engine.open(store, mode="reactive", tiers=tier) as eng:
            got = await asyncio.gather(
                text_of(eng, PROMPTS[0], 6),
                text_of(eng, PROMPTS[0], 6),
                text_of(eng, PROMPTS[1], 6),
                return_exceptions=True,
            )
        return solo, list(got)

    solo, got = run(main())
    errors = [g for g in got if isinstance(g, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], TierReadError)  # one fault, one request
    want = [solo[0], solo[0], solo[1]]
    assert all(g == w for g, w in zip(got, want, strict=True) if isinstance(g, str))
