"""A request joining a running batch with `join_chunk`: its prompt in pieces, the running
requests decoding one step between two pieces; every request's tokens equal its solo run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import MockTier
from test_batch import PROMPT, alone, batched_steps, run, together

from edge0.errors import ConfigError
from edge0.runtime.engine.api import Engine

# 13 tokens: with join_chunk 3 the last piece is one token, whose step predicts the first
# decode step from the state the previous piece left (restored after the others' steps)
LONG = [7, 3, 250, 11, 42, 9, 8, 100, 5, 17, 61, 33, 2]


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_5_moe"]


def steps_before_joined(rows: list[int], joined: int) -> int:
    """Decode steps before the first one that fed `joined` requests."""
    return rows.index(joined)


def joined_run(
    path: Path,
    prompts: list[list[int]],
    ns: list[int],
    after: list[int],
    max_batch: int,
    **opts: Any,
) -> tuple[list[list[int]], list[int]]:
    async def main() -> tuple[list[list[int]], list[int]]:
        async with Engine.open(path, tiers=MockTier(path), max_batch=max_batch, **opts) as eng:
            got = await together(eng, prompts, ns, after)
            return got, batched_steps(eng)

    out: tuple[list[list[int]], list[int]] = run(main())
    return out


@pytest.mark.parametrize("mode", ["resident", "reactive", "hint", "route"])
@pytest.mark.parametrize("chunk", [1, 2])
def test_a_joining_prompt_in_pieces_decodes_as_alone(store: Path, mode: str, chunk: int) -> None:
    """13 prompt tokens in pieces of join_chunk 3 rounded up to whole prefill chunks (chunk 1:
    4 pieces of 3 one-token steps and 1 token; chunk 2: 3 pieces of two 2-token chunks and 1
    token) while one request decodes: it gets one more step per piece after the first before
    the batch of two, and both requests' tokens equal their solo runs."""
    opts: dict[str, Any] = dict(mode=mode, prefill_chunk=chunk)
    if mode in ("hint", "route"):
        opts["predictor"] = "init"
    prompts, ns, after = [PROMPT, LONG], [12, 6], [0, 3]
    ref = [run(alone(store, p, n, **opts)) for p, n in zip(prompts, ns, strict=True)]
    whole, rows_whole = joined_run(store, prompts, ns, after, 2, **opts)
    pieces, rows_pieces = joined_run(store, prompts, ns, after, 2, join_chunk=3, **opts)
    assert whole == ref
    assert pieces == ref
    between = {1: 4, 2: 3}[chunk]
    assert steps_before_joined(rows_pieces, 2) == steps_before_joined(rows_whole, 2) + between


def test_pieces_between_batched_steps_and_a_third_request(store: Path) -> None:
    """Two requests decode batched while a third's prompt runs in pieces; all as alone."""
    opts: dict[str, Any] = dict(mode="route", predictor="init", prefill_chunk=2)
    prompts, ns, after = [PROMPT, [3, 9, 200], LONG], [18, 18, 5], [0, 0, 4]
    ref = [run(alone(store, p, n, **opts)) for p, n in zip(prompts, ns, strict=True)]
    _, rows_whole = joined_run(store, prompts, ns, after, 3, **opts)
    got, rows = joined_run(store, prompts, ns, after, 3, join_chunk=2, **opts)
    assert got == ref
    # pieces of 2 tokens: 7 pieces, 6 batched steps of the two running between them
    joined = steps_before_joined(rows, 3)
    assert joined == steps_before_joined(rows_whole, 3) + 6
    assert rows[joined - 6 : joined] == [2] * 6


def test_a_bad_join_chunk_is_refused(store: Path) -> None:
    async def main() -> None:
        async with Engine.open(store, tiers=MockTier(store), max_batch=2, join_chunk=0):
            pass

    with pytest.raises(ConfigError, match="join_chunk= must be at least 1, got 0"):
        run(main())


def test_the_oracle_routes_a_joining_prompt_by_its_own_positions(store: Path) -> None:
    """Route with the oracle (keyed by position) replaying LONG: request 0 decodes LONG while a
    second LONG joins in pieces; the joiner's position must be its own between pieces (the
    running request's steps move the streams' position), else its routing is not LONG's."""
    n = 8
    ref = run(alone(store, LONG, n, mode="resident", prefill_chunk=2))

    async def record() -> dict[tuple[int, int], list[int]]:
        async with Engine.open(
            store, tiers=MockTier(store), mode="reactive", prefill_chunk=2, record_routing=True
        ) as eng:
            [t async for t in eng.tokens(LONG, max_tokens=n + 6, stop=False)]
            assert eng.setup.ctx.recording is not None
            return dict(eng.setup.ctx.recording)

    opts = dict(mode="route", predictor="oracle", recording=run(record()), prefill_chunk=2)
    got, rows = joined_run(store, [LONG, LONG], [n + 6, n], [0, 2], 2, join_chunk=3, **opts)
    assert got == [run(alone(store, LONG, n + 6, mode="resident", prefill_chunk=2)), ref]
    assert 2 in rows
