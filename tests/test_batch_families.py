"""Batched decode on every family fixture: stacked where the family is listed, greenlets elsewhere.

Each family decodes three prompts of different lengths batched (rows join mid-stream,
so the merged caches are really left-padded, and leave at different steps) and alone;
the tokens must be equal. The families whose rows stack (`Family.stacks`) must run the
stacked forward, the others (caches without a batch form, or attention not tested with
batch offsets) the greenlet path.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import MockTier
from test_batch import together

from edge0.families import family_for
from edge0.layout.convert import ConvertOptions, convert
from edge0.runtime.engine.api import Engine
from edge0.synth.tiny_families import CONFIGS, fixture_file, write_family

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAMILIES = tuple(CONFIGS)
PROMPTS = [[5, 17, 42, 8, 99, 3, 61], [3, 9, 200], [11, 12, 13, 14, 15]]
NS, AFTER = [9, 6, 4], [0, 0, 2]
LIMIT_S = 120.0


def run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main, LIMIT_S))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batch-families")
    out = {}
    for mt in FAMILIES:
        hf = write_family(fixture_file(FIXTURES, mt), root / mt / "hf")
        convert(hf, root / mt / "e0", ConvertOptions(group_size=32))
        out[mt] = root / mt / "e0"
    return out


async def alone(path: Path, prompt: list[int], n: int) -> list[int]:
    async with Engine.open(path, tiers=MockTier(path), mode="reactive") as eng:
        return [t async for t in eng.tokens(prompt, max_tokens=n, stop=False)]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_decodes_batched_as_alone(built: dict[str, Path], model_type: str) -> None:
    path = built[model_type]
    ref = [run(alone(path, p, n)) for p, n in zip(PROMPTS, NS, strict=True)]

    async def main() -> tuple[list[list[int]], list[int], Any]:
        async with Engine.open(path, tiers=MockTier(path), mode="reactive", max_batch=3) as eng:
            got = await together(eng, PROMPTS, NS, AFTER)
            assert eng.batcher is not None
            return got, [s.rows for s in eng.batcher.log], eng.batcher._step

    got, rows, step = run(main())
    assert got == ref
    assert 3 in rows and 2 in rows  # batched steps with rows of different lengths
    assert step.stacked is family_for(model_type).stacks
    if step.stacked:
        assert 2 <= step.stack.merges < sum(r > 1 for r in rows)  # merged when rows change
