"""Batched decode, isolation: a failing, cancelled or slow request leaves the others running."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PROMPT, MockTier, build_store

from edge0.errors import ConfigError, TierReadError
from edge0.runtime.engine.api import Engine
from edge0.storage.tier import ExpertKey

OTHER = [3, 9, 200, 31]
LIMIT_S = 60.0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("batch-iso"), "qwen3_moe", experts=16)


def run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main, LIMIT_S))


async def routing(path: Path, prompt: list[int], n: int) -> tuple[list[int], dict[Any, Any]]:
    async with Engine.open(path, tiers=MockTier(path), mode="reactive", record_routing=True) as eng:
        toks = [t async for t in eng.tokens(prompt, max_tokens=n, stop=False)]
        assert eng.setup.ctx.recording is not None
        return toks, dict(eng.setup.ctx.recording)


def test_a_failed_read_ends_only_the_requests_that_needed_it(store: Path) -> None:
    n = 10
    a_ref, a_rec = run(routing(store, PROMPT, n))
    b_ref, b_rec = run(routing(store, OTHER, n))
    streamed = set(sorted({layer for _, layer in a_rec})[1:])  # layer 0 stays resident
    used_b = {(layer, e) for (_, layer), es in b_rec.items() for e in es}
    in_prompt = {(layer, e) for (pos, layer), es in a_rec.items() if pos < len(PROMPT) for e in es}
    only_a = sorted(
        (layer, e)
        for (pos, layer), es in a_rec.items()
        for e in es
        if layer in streamed and pos >= len(PROMPT) and (layer, e) not in used_b | in_prompt
    )
    assert only_a, "the store has no expert only request A decodes with: pick another seed"
    bad = ExpertKey(*only_a[0])

    async def main() -> tuple[BaseException | None, list[int], list[int], list[int]]:
        tier = MockTier(store, fail={bad}, faults=1)
        async with Engine.open(store, tiers=tier, mode="reactive", max_batch=2) as eng:
            a: list[int] = []
            err: BaseException | None = None

            async def first() -> None:
                nonlocal err
                try:
                    async for t in eng.tokens(PROMPT, max_tokens=n, stop=False):
                        a.append(t)
                except TierReadError as exc:
                    err = exc

            async def second() -> list[int]:
                return [t async for t in eng.tokens(OTHER, max_tokens=n, stop=False)]

            _, b = await asyncio.gather(first(), second())
            c = [t async for t in eng.tokens(PROMPT, max_tokens=n, stop=False)]  # after the fault
            return err, a, b, c

    err, a, b, c = run(main())
    assert isinstance(err, TierReadError) and (err.layer, err.expert) == only_a[0]
    assert a == a_ref[: len(a)] and len(a) < n
    assert b == b_ref
    assert c == a_ref


def test_a_cancelled_request_leaves_the_batch_and_the_others_go_on(store: Path) -> None:
    b_ref, _ = run(routing(store, OTHER, 12))

    async def main() -> tuple[list[int], str, list[int], list[int]]:
        async with Engine.open(
            store, tiers=MockTier(store), mode="hint", predictor="init", max_batch=2
        ) as eng:
            b_task = asyncio.create_task(_collect(eng, OTHER, 12))
            async with contextlib.aclosing(eng.tokens(PROMPT, max_tokens=500, stop=False)) as it:
                got = 0
                async for _ in it:
                    got += 1
                    if got == 3:
                        break
            b = await b_task
            again = await _collect(eng, OTHER, 12)
            await eng.wait_idle()
            assert eng.batcher is not None
            return b, "", again, [s.rows for s in eng.batcher.log]

    b, _, again, rows = run(main())
    assert b == b_ref and again == b_ref
    assert 2 in rows
    assert sum(1 for r in rows if r == 2) < 12  # the cancelled one left after its 3rd token


async def _collect(eng: Engine, prompt: list[int], n: int) -> list[int]:
    return [t async for t in eng.tokens(prompt, max_tokens=n, stop=False)]


def test_a_slow_consumer_is_paused_at_its_buffer_and_resumes_exactly(store: Path) -> None:
    a_ref, _ = run(routing(store, PROMPT, 30))
    b_ref, _ = run(routing(store, OTHER, 20))

    async def main() -> tuple[list[int], list[int], int]:
        async with Engine.open(
            store, tiers=MockTier(store), mode="reactive", max_batch=2, token_buffer=3
        ) as eng:
            assert eng.batcher is not None
            resume = asyncio.Event()
            a: list[int] = []

            async def slow() -> None:
                async for t in eng.tokens(PROMPT, max_tokens=30, stop=False):
                    a.append(t)
                    if len(a) == 1:
                        await resume.wait()  # stops pulling while B decodes

            a_task = asyncio.create_task(slow())
            b = await _collect(eng, OTHER, 20)
            held = eng.batcher.active[0].n if eng.batcher.active else -1  # A's tokens so far
            resume.set()
            await a_task
            return a, b, held

    a, b, held = run(main())
    assert b == b_ref
    assert 1 <= held <= 1 + 3  # the one it took and a full buffer: paused, not run ahead
    assert a == a_ref  # nothing dropped, the pause changed no token


def test_bad_batch_options_are_refused(store: Path) -> None:
    async def open_with(**opts: Any) -> None:
        async with Engine.open(store, tiers=MockTier(store), **opts):
            pass

    with pytest.raises(ConfigError, match=r"--max-batch \(max_batch=\) must be at least 1"):
        run(open_with(max_batch=0))
    with pytest.raises(ConfigError, match="token_buffer"):
        run(open_with(max_batch=2, token_buffer=0))
    with pytest.raises(ConfigError, match="--hosts"):
        run(open_with(max_batch=2, hosts=2))


def test_a_failed_batched_step_ends_its_requests_and_the_engine_serves_on(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge0.runtime.compute import batch

    real, calls = batch.batched_layer, [0]

    def once(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("injected batch failure")
        return real(*args)

    monkeypatch.setattr(batch, "batched_layer", once)
    a_ref, _ = run(routing(store, PROMPT, 6))
    b_ref, _ = run(routing(store, OTHER, 6))

    async def main() -> tuple[list[Any], list[list[int]]]:
        async with Engine.open(store, tiers=MockTier(store), mode="reactive", max_batch=2) as eng:

            async def outcome(prompt: list[int]) -> Any:
                try:
                    return await _collect(eng, prompt, 6)
                except RuntimeError as exc:
                    return str(exc)

            first = list(await asyncio.gather(outcome(PROMPT), outcome(OTHER)))
            again = list(await asyncio.gather(_collect(eng, PROMPT, 6), _collect(eng, OTHER, 6)))
            return first, again

    first, again = run(main())
    assert first == ["injected batch failure"] * 2
    assert again == [a_ref, b_ref]
