"""Engine API: text then stats, FIFO concurrent requests, cancellation, sync wrapper, options."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PROMPT, MockTier

from edge0.errors import ConfigError
from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.summary import RunStats
from edge0.runtime.engine.sync import SyncEngine


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_5_moe"]  # the session's read-only store (conftest.py)


async def collect(eng: Engine, prompt: Any, n: int = 8) -> tuple[str, RunStats]:
    pieces = [p async for p in eng.generate(prompt, max_tokens=n)]
    *text, stats = pieces
    assert all(isinstance(t, str) for t in text)
    assert isinstance(stats, RunStats)
    return "".join(text), stats


def test_generate_streams_text_then_stats(store: Path) -> None:
    async def main() -> tuple[str, RunStats, str]:
        async with Engine.open(store, mode="resident") as eng:
            ref, _ = await collect(eng, "hello world")
        async with Engine.open(store, mode="route", tiers="ram:1MiB>pread") as eng:
            text, stats = await collect(eng, "hello world")
        return ref, stats, text

    ref, stats, text = asyncio.run(main())
    assert text and stats.generated_tokens >= 1
    assert stats.mode == "route" and stats.predictor == "init"
    assert stats.prompt_tokens > 0 and stats.decode_tps >= 0
    # The first token comes from prefill: decode steps are one fewer unless EOS ended it.
    extra = 1 if stats.finish_reason == "stop" else 0
    assert stats.decode_steps == stats.generated_tokens - 1 + extra
    assert "decode" in stats.summary()


def test_concurrent_requests_are_served_fifo(store: Path) -> None:
    async def main() -> tuple[list[str], list[str], list[str]]:
        order: list[str] = []
        async with Engine.open(store, mode="hint", tiers=MockTier(store, delay=0.001)) as eng:
            solo = [(await collect(eng, p))[0] for p in ("first", "second")]

            async def client(name: str) -> str:
                pieces = []
                async for p in eng.generate(name, max_tokens=8):
                    if isinstance(p, str):
                        order.append(name)
                        pieces.append(p)
                return "".join(pieces)

            t1 = asyncio.create_task(client("first"))
            await asyncio.sleep(0)
            t2 = asyncio.create_task(client("second"))
            both = list(await asyncio.gather(t1, t2))
        return solo, both, order

    solo, both, order = asyncio.run(main())
    assert both == solo
    assert order == sorted(order, key=lambda n: n != "first"), "second waited for first"


def test_caller_that_stops_iterating_releases_the_engine(store: Path) -> None:
    async def main() -> tuple[list[int], list[int], str]:
        async with Engine.open(store, mode="reactive", tiers=MockTier(store)) as eng:
            ref = [t async for t in eng.tokens(PROMPT, max_tokens=6, stop=False)]
            async with contextlib.aclosing(eng.tokens(PROMPT, max_tokens=50, stop=False)) as it:
                async for _ in it:
                    break
            await eng.wait_idle()  # the closed request stops after the step in flight
            reason = eng.last_stats.finish_reason if eng.last_stats else ""
            # a task cancelled mid-request also releases it
            task = asyncio.create_task(
                asyncio.wait_for(collect(eng, "a long one", n=200), timeout=0.05)
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await task
            again = [t async for t in eng.tokens(PROMPT, max_tokens=6, stop=False)]
        return ref, again, reason

    ref, again, reason = asyncio.run(main())
    assert again == ref
    assert reason == "cancelled"


def test_sync_wrapper(store: Path) -> None:
    with SyncEngine(store, mode="hint", tiers="pread") as eng:
        pieces = list(eng.generate("hello", max_tokens=4))
    assert isinstance(pieces[-1], RunStats)
    assert all(isinstance(p, str) for p in pieces[:-1])
    with pytest.raises(ConfigError, match="unknown mode"):
        SyncEngine(store, mode="nope")


def test_memory_budget_buys_slots_not_a_ram_cache(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edge0.runtime.plan.memory as memory

    monkeypatch.setattr(memory, "more_resident", lambda *a: 0)  # else the tiny store is resident

    async def main(budget: str) -> Any:
        async with Engine.open(store, mode="route", tiers="ram>pread", memory_budget=budget) as eng:
            return eng.setup.memory_plan, eng.setup.tier

    plan, tier = asyncio.run(main("4GiB"))
    # the rest buys slots, up to one per streamed record of the (tiny) store; what is left is
    # unspent, and the unsized `ram` stage is dropped (a RAM cache only where its size is given)
    assert plan.cache == 0 and plan.extra_slots > 0 and "left unspent" in plan.line()
    assert plan.overhead > 0 and plan.working > 0 and plan.heads > 0  # process RSS is counted
    assert tier.name != "ram"
    with pytest.raises(ConfigError, match="memory-budget"):
        asyncio.run(main("1KiB"))


def test_under_a_budget_the_files_read_once_leave_the_page_cache(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resident weights and the heads are read whole at load and never again: under a
    memory budget their cached pages are dropped once the model is built (a memory cgroup
    counts them), and no other file's are; without a budget the page cache is left alone."""
    import shutil

    from edge0.layout import pagecache
    from edge0.layout.manifest import RESIDENT_FILE
    from edge0.routing.prerouter_config import FILES

    model = tmp_path / "m"
    shutil.copytree(store, model)
    heads = FILES["layer"][0]
    (model / heads).write_bytes(b"")  # a heads file this run does not use: dropped all the same
    dropped: list[str] = []
    monkeypatch.setattr(pagecache, "drop", lambda p: dropped.append(Path(p).name))

    async def main(**budget: str) -> str:
        async with Engine.open(model, mode="hint", tiers="pread", **budget) as eng:
            pieces = [p async for p in eng.generate("hello", max_tokens=3)]
        return "".join(p for p in pieces if isinstance(p, str))

    plain = asyncio.run(main())
    assert dropped == []
    budgeted = asyncio.run(main(memory_budget="4GiB"))
    assert dropped == [RESIDENT_FILE, heads]
    assert budgeted == plain  # the dropped pages were never needed again


@pytest.mark.parametrize(
    "opts, match",
    [
        ({"mode": "fast"}, "unknown mode"),
        ({"predictor": "magic"}, "unknown predictor"),
        ({"top_k": 0}, "top-k"),
        ({"top_k": 99}, "exceeds"),
        ({"mode": "route", "predictor": "heads"}, "prerouter"),
        ({"mode": "route", "tiers": "nosuchtier"}, "unknown tier"),
    ],
)
def test_bad_options_raise_config_errors(store: Path, opts: dict[str, Any], match: str) -> None:
    async def main() -> None:
        async with Engine.open(store, **opts):
            pass

    with pytest.raises(ConfigError, match=match):
        asyncio.run(main())


def test_text_pieces_join_to_the_decoded_tokens(store: Path) -> None:
    async def main() -> tuple[str, str]:
        async with Engine.open(store, mode="hint", tiers=MockTier(store)) as eng:
            text, _ = await collect(eng, PROMPT, n=10)
            ids = [t async for t in eng.tokens(PROMPT, max_tokens=10)]
            return text, eng.tokenizer.decode(ids)

    text, decoded = asyncio.run(main())
    assert text == decoded and text


class HangingTier(MockTier):
    """Never finishes a read (a dead device)."""

    async def read_into(self, key: Any, dest: memoryview) -> Any:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_closing_the_engine_while_compute_waits_on_a_read_does_not_hang(store: Path) -> None:
    async def main() -> float:
        async with Engine.open(store, mode="reactive", tiers=HangingTier(store)) as eng:
            task = asyncio.create_task(collect(eng, PROMPT, n=4))
            await asyncio.sleep(0.5)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            t0 = time.perf_counter()
        return time.perf_counter() - t0

    assert asyncio.run(main()) < 10.0


def test_empty_and_too_long_prompts_are_prompt_errors(store: Path) -> None:
    from edge0.errors import PromptError

    async def main(ids: list[int]) -> None:
        async with Engine.open(store, mode="reactive", tiers=MockTier(store)) as eng:
            _ = [t async for t in eng.tokens(ids, max_tokens=2)]

    with pytest.raises(PromptError, match="empty"):
        asyncio.run(main([]))
    with pytest.raises(PromptError, match="max_position_embeddings"):
        asyncio.run(main([5] * 5000))
