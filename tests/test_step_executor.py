"""The step carries its executor: a one-token step, a prompt chunk, a batched step and the in-graph
route policy each run the streaming blocks through their own executor, which the step clock
holds; the block itself has one path."""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from runtime_helpers import PROMPT, MockTier
from test_batch import together
from test_runtime_families import D, _blocks, _resident_stream

from edge0.errors import Edge0Error
from edge0.families import family_for
from edge0.runtime.compute.batch import BatchStep
from edge0.runtime.compute.live import LiveFeed, StepTrace
from edge0.runtime.compute.steps import Steps
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.trace import Tracer
from edge0.runtime.layers.block import StreamingMoE
from edge0.runtime.layers.policy import RoutePolicy
from edge0.runtime.layers.single import OnDeviceToken, SingleToken
from edge0.runtime.prefill.chunks import ChunkState

N = 4
Seen = dict[int, set[str]]  # step -> the executors its blocks ran through


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """Every executor call of a streaming block, by step: the executor's class."""
    got: Seen = defaultdict(set)
    for cls in (SingleToken, ChunkState, BatchStep):
        real = cls.forward

        def forward(self: Any, block: StreamingMoE, x: mx.array, real: Any = real) -> mx.array:
            got[block.stream.steps.cur.step].add(type(self).__name__)  # a chunk's record
            return real(self, block, x)  # type: ignore[no-any-return]

        monkeypatch.setattr(cls, "forward", forward)
    return got


def decode(path: Path, **opts: Any) -> Engine:
    async def go() -> Engine:
        async with Engine.open(path, tiers=MockTier(path), **opts) as eng:
            toks = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]
            assert len(toks) == N
            return eng

    return asyncio.run(asyncio.wait_for(go(), 120))


def test_the_clock_hands_each_step_its_executor() -> None:
    steps = Steps("reactive", 2, Tracer())
    assert isinstance(steps.token, SingleToken) and steps.executor is steps.token
    chunk = ChunkState(steps, 0)
    steps.begin_step(prefill=True, prefetch=False, executor=chunk)
    assert steps.executor is chunk
    steps.begin_step(prefill=False)
    assert steps.executor is steps.token
    steps.groups = object()  # type: ignore[assignment]  # grouped syncs: the in-graph choice
    steps.use_policy(RoutePolicy("available-first", 0.0, steps))
    assert isinstance(steps.token, OnDeviceToken) and steps.executor is steps.token
    steps.use_policy(RoutePolicy("available-first-sync", 0.0, steps))  # on the host
    assert type(steps.token) is SingleToken and steps.executor is steps.token


def test_prompt_chunks_and_one_token_steps_run_through_their_executors(
    store: Path, seen: Seen
) -> None:
    """A 5-token prompt in chunks of 2: two chunk steps (the chunk's executor), the last
    prompt token and the decode steps one token each."""
    decode(store, mode="hint", predictor="init", prefill_chunk=2)
    kinds = [sorted(seen[s]) for s in sorted(seen)]
    assert kinds == [["ChunkState"]] * 2 + [["SingleToken"]] * (1 + N - 1)


def test_a_batched_step_runs_through_the_batch(store: Path, seen: Seen) -> None:
    async def go() -> list[list[int]]:
        async with Engine.open(store, tiers=MockTier(store), max_batch=2) as eng:
            return await together(eng, [PROMPT, [3, 9, 200]], [6, 6], [0, 1])

    got = asyncio.run(asyncio.wait_for(go(), 120))
    assert [len(t) for t in got] == [6, 6]
    assert all(len(kinds) == 1 for kinds in seen.values())  # one executor per step
    kinds = {next(iter(k)) for k in seen.values()}
    assert "BatchStep" in kinds and "SingleToken" in kinds


def test_the_live_feed_tells_a_batched_step_by_its_executor(store: Path) -> None:
    """The live feed's `batch` flag is the step's executor: True exactly on batched steps."""
    traces: list[StepTrace] = []

    async def go() -> None:
        async with Engine.open(store, tiers=MockTier(store), max_batch=2) as eng:
            LiveFeed(eng.setup.ctx, eng.setup.tracer, traces.append).attach()
            await together(eng, [PROMPT, [3, 9, 200]], [6, 6], [0, 1])
            assert eng.batcher is not None
            assert sum(t.batch for t in traces) == sum(s.rows > 1 for s in eng.batcher.log)

    asyncio.run(asyncio.wait_for(go(), 120))
    assert any(t.batch for t in traces) and not all(t.batch for t in traces)


def test_the_in_graph_policy_brings_its_own_executor(store: Path, seen: Seen) -> None:
    opts: dict[str, Any] = dict(mode="route", predictor="init", prefill_chunk=len(PROMPT))
    eng = decode(store, route_policy="available-first", **opts)
    assert eng.setup.ctx.policy.on_device
    assert isinstance(eng.setup.ctx.token, OnDeviceToken)
    kinds = [sorted(seen[s]) for s in sorted(seen)]
    assert kinds == [["ChunkState"]] + [["OnDeviceToken"]] * (N - 1)
    assert eng.last_stats.recall_slots > 0  # route decode steps chose in the graph


def test_the_block_has_one_path() -> None:
    """`StreamingMoE.__call__` only hands its input to the step's executor: no branch on
    the shape of the step, one reach into its stream."""
    src = textwrap.dedent(inspect.getsource(StreamingMoE.__call__))
    (fn,) = ast.parse(src).body
    assert isinstance(fn, ast.FunctionDef)
    (stmt,) = fn.body
    assert isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Call)
    assert ast.unparse(stmt.value) == "self.stream.steps.executor.forward(self, x)"
    block_src = inspect.getsource(inspect.getmodule(StreamingMoE))  # type: ignore[arg-type]
    for name in ("steps.batch", "steps.chunk", "steps.policy", "on_device"):
        assert name not in block_src


def test_a_multi_token_input_outside_a_chunk_is_refused() -> None:
    block = _blocks()["qwen3_moe"]
    nn.quantize(block.switch_mlp, group_size=32, bits=4)
    moe = StreamingMoE(block, 0, family_for("qwen3_moe"), _resident_stream(block))
    with pytest.raises(Edge0Error, match="layer 0 runs one token per step, got input shape"):
        moe(mx.zeros((1, 2, D)))
