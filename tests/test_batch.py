"""Batched decode: every request of a batch decodes the tokens it decodes alone, in every mode.

Joins are tied to tokens, not clocks: request i starts once request 0 has produced
`after[i]` tokens, so the step at which it joins (and, with its own max_tokens, the
step at which it leaves) is the same on every run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_helpers import PROMPT, MockTier

from edge0.model.generate import SamplingSettings
from edge0.runtime.engine.api import Engine

FAMILIES = ["qwen3_moe", "qwen3_5_moe"]
PROMPTS = [PROMPT, [3, 9, 200], [11, 12, 13, 14, 15, 16, 17], [250]]
LIMIT_S = 60.0


@pytest.fixture(scope="module")
def stores(runtime_stores: dict[str, Path]) -> dict[str, Path]:
    return {mt: runtime_stores[mt] for mt in FAMILIES}


def run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main, LIMIT_S))


async def alone(
    path: Path, prompt: list[int], n: int, sampling: SamplingSettings | None = None, **opts: Any
) -> list[int]:
    opts.setdefault("tiers", MockTier(path))
    async with Engine.open(path, **opts) as eng:
        toks = eng.tokens(prompt, max_tokens=n, sampling=sampling, stop=False)
        return [t async for t in toks]


async def together(
    eng: Engine,
    prompts: list[list[int]],
    ns: list[int],
    after: list[int],
    sampling: list[SamplingSettings | None] | None = None,
) -> list[list[int]]:
    """Request 0 starts at once; request i > 0 once request 0 has yielded `after[i]` tokens."""
    gates = [asyncio.Event() for _ in prompts]
    gates[0].set()
    out: list[list[int]] = [[] for _ in prompts]

    async def one(i: int) -> None:
        await gates[i].wait()
        s = sampling[i] if sampling else None
        async for t in eng.tokens(prompts[i], max_tokens=ns[i], sampling=s, stop=False):
            out[i].append(t)
            if i == 0:
                for j in range(1, len(prompts)):
                    if after[j] <= len(out[0]):
                        gates[j].set()
        if i == 0:
            for g in gates:
                g.set()

    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    return out


def batched_steps(eng: Engine) -> list[int]:
    assert eng.batcher is not None
    return [s.rows for s in eng.batcher.log]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["resident", "reactive", "hint", "route"])
def test_every_request_of_a_batch_decodes_its_tokens_alone(
    stores: dict[str, Path], family: str, mode: str
) -> None:
    """Different prompts and lengths, joins while others decode, leaves at different steps;
    route and hint with the untrained heads (route: the batched prediction is the routing)."""
    path = stores[family]
    opts = {"mode": mode, "predictor": "init"} if mode in ("hint", "route") else {"mode": mode}
    ns, after = [10, 6, 9, 4], [0, 0, 3, 5]
    ref = [run(alone(path, p, n, **opts)) for p, n in zip(PROMPTS, ns, strict=True)]

    async def main() -> tuple[list[list[int]], list[int]]:
        async with Engine.open(path, tiers=MockTier(path), max_batch=3, **opts) as eng:
            got = await together(eng, PROMPTS, ns, after)
            return got, batched_steps(eng)

    got, rows = run(main())
    assert got == ref
    assert max(rows) == 3 and 2 in rows and 1 in rows  # joined, capped, left, alone again


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("first", ["resident", "wrap", "reactive"])
def test_route_with_the_oracle_matches_resident_in_a_batch(
    stores: dict[str, Path], family: str, first: str
) -> None:
    """The oracle replays one recorded request (keyed by position): the batch is that prompt
    at staggered positions, so every step's rows want different sets."""
    path = stores[family]
    n = 12
    ref = run(alone(path, PROMPT, n, mode="resident"))

    async def record() -> dict[tuple[int, int], list[int]]:
        async with Engine.open(
            path, tiers=MockTier(path), mode="reactive", record_routing=True
        ) as eng:
            [t async for t in eng.tokens(PROMPT, max_tokens=n, stop=False)]
            assert eng.setup.ctx.recording is not None
            return dict(eng.setup.ctx.recording)

    recording = run(record())

    async def main() -> tuple[list[list[int]], list[int], int]:
        async with Engine.open(
            path,
            tiers=MockTier(path),
            mode="route",
            predictor="oracle",
            recording=recording,
            first_layer=first,
            max_batch=4,
        ) as eng:
            got = await together(eng, [PROMPT] * 3, [n, n - 2, n - 5], [0, 2, 5])
            return got, batched_steps(eng), eng.setup.ctx.routed_by_prediction

    got, rows, routed = run(main())
    assert got == [ref, ref[: n - 2], ref[: n - 5]]
    assert 3 in rows
    assert routed > 0


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(FAMILIES),
    mode=st.sampled_from(["reactive", "hint", "route"]),
    ns=st.lists(st.integers(1, 7), min_size=2, max_size=4),
    data=st.data(),
)
def test_property_random_arrivals_decode_as_alone(
    stores: dict[str, Path], family: str, mode: str, ns: list[int], data: st.DataObject
) -> None:
    path = stores[family]
    k = len(ns)
    after = [0] + data.draw(st.lists(st.integers(0, ns[0]), min_size=k - 1, max_size=k - 1))
    max_batch = data.draw(st.integers(2, 4))
    prompts = PROMPTS[:k]
    opts = {"mode": mode, "predictor": "init"} if mode != "reactive" else {"mode": mode}
    ref = [run(alone(path, p, n, **opts)) for p, n in zip(prompts, ns, strict=True)]

    async def main() -> list[list[int]]:
        async with Engine.open(path, tiers=MockTier(path), max_batch=max_batch, **opts) as eng:
            return await together(eng, prompts, ns, after)

    assert run(main()) == ref


def test_seeded_sampling_per_request_in_a_batch(stores: dict[str, Path]) -> None:
    """Each request keeps its own sampler and seed (and greedy stays greedy) in a batch."""
    path = stores["qwen3_5_moe"]
    samplings: list[SamplingSettings | None] = [
        SamplingSettings(temp=0.9, seed=1),
        SamplingSettings(temp=0.7, top_p=0.9, seed=2),
        None,
    ]
    opts = {"mode": "hint", "predictor": "init"}
    ref = [
        run(alone(path, p, 8, sampling=s, **opts))
        for p, s in zip(PROMPTS[:3], samplings, strict=True)
    ]

    async def main() -> list[list[int]]:
        async with Engine.open(path, tiers=MockTier(path), max_batch=3, **opts) as eng:
            return await together(eng, PROMPTS[:3], [8, 8, 8], [0, 1, 1], samplings)

    assert run(main()) == ref


def test_a_batch_reads_each_expert_once_per_step(stores: dict[str, Path]) -> None:
    """Four copies of one prompt decoded together read what one of them reads alone."""
    path = stores["qwen3_moe"]

    async def decode_bytes(copies: int) -> tuple[int, list[int]]:
        async with Engine.open(path, tiers=MockTier(path), mode="reactive", max_batch=4) as eng:

            async def one() -> list[int]:  # all are queued before the first decode step
                return [t async for t in eng.tokens(PROMPT, max_tokens=10, stop=False)]

            got = await asyncio.gather(*(one() for _ in range(copies)))
            assert all(g == got[0] for g in got)
            return sum(s.bytes for s in eng.batcher.log), batched_steps(eng)

    one_bytes, _ = run(decode_bytes(1))
    four_bytes, rows = run(decode_bytes(4))
    assert rows == [4] * 9
    assert 0 < four_bytes <= one_bytes
