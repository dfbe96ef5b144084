"""The stacked batched step: merged caches across steps, rows joining and leaving, full heads,
seeded choices of one prompt, a stale cache refused, and the greenlet path kept on request.

Every test compares a batch's tokens with each request decoded alone (exact equality).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from runtime_helpers import PROMPT, MockTier
from test_batch import PROMPTS, alone, together

import edge0.model.loader
from edge0.errors import Edge0Error
from edge0.model.generate import SamplingSettings
from edge0.routing.prerouter import PrerouterSet
from edge0.runtime.compute import batch
from edge0.runtime.compute.stack import HeldCache
from edge0.runtime.engine.api import Engine

LIMIT_S = 60.0


def run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main, LIMIT_S))


def runs_of_batched_steps(rows: list[int]) -> int:
    """Maximal runs of consecutive batched steps (B > 1) with the same number of rows."""
    n, last = 0, 1
    for r in rows:
        if r > 1 and r != last:
            n += 1
        last = r
    return n


async def batched(
    path: Path,
    prompts: list[list[int]],
    ns: list[int],
    after: list[int],
    max_batch: int,
    sampling: list[SamplingSettings | None] | None = None,
    **opts: Any,
) -> tuple[list[list[int]], list[int], Any]:
    async with Engine.open(path, tiers=MockTier(path), max_batch=max_batch, **opts) as eng:
        got = await together(eng, prompts, ns, after, sampling)
        assert eng.batcher is not None
        return got, [s.rows for s in eng.batcher.log], eng.batcher._step


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"])
@pytest.mark.parametrize("mode", ["reactive", "route"])
def test_rows_join_and_leave_with_their_own_lengths(
    runtime_stores: dict[str, Path], family: str, mode: str
) -> None:
    """Prompts of 1 to 7 tokens join while others decode (left padding in the merged caches)
    and leave early; the caches merge once per change of rows, not once per step."""
    path = runtime_stores[family]
    opts = {"mode": mode, "predictor": "init"} if mode == "route" else {"mode": mode}
    prompts = [PROMPTS[2], PROMPTS[3], PROMPTS[1], PROMPT]
    ns, after = [14, 3, 9, 6], [0, 0, 4, 6]
    ref = [run(alone(path, p, n, **opts)) for p, n in zip(prompts, ns, strict=True)]
    got, rows, step = run(batched(path, prompts, ns, after, 3, **opts))
    assert got == ref
    assert step.stacked is True
    assert max(rows) == 3 and 2 in rows and 1 in rows
    assert step.stack.merges == runs_of_batched_steps(rows)
    assert step.stack.caches is None  # all done: the stack holds nothing


def test_full_prediction_heads_route_a_batch_as_alone(
    runtime_stores: dict[str, Path], tmp_path: Path
) -> None:
    """Heads that read the executed and previous sets (fc1/fc2/lin_m nonzero) run once over the
    stacked rows; in route mode their prediction is the routing, so any row difference shows."""
    path = tmp_path / "store"
    shutil.copytree(runtime_stores["qwen3_moe"], path)
    heads = PrerouterSet.from_model(edge0.model.loader.load(path).model)
    mx.random.seed(11)
    for head in heads.heads.values():
        for lin in (head.fc1, head.fc2, head.lin_m):
            lin.weight = mx.random.normal(lin.weight.shape) * 0.5
    heads.save(path)
    opts = {"mode": "route", "predictor": "heads"}
    ns, after = [10, 7, 5], [0, 1, 3]
    ref = [run(alone(path, p, n, **opts)) for p, n in zip(PROMPTS[:3], ns, strict=True)]
    got, rows, step = run(batched(path, PROMPTS[:3], ns, after, 3, **opts))
    assert got == ref
    assert step.stacked is True and 3 in rows


def test_seeded_choices_of_one_prompt_batch_as_alone(runtime_stores: dict[str, Path]) -> None:
    """n choices of one prompt (the server's `n`: choice i samples with seed + i) decode
    together as each alone."""
    path = runtime_stores["qwen3_5_moe"]
    samplings: list[SamplingSettings | None] = [
        SamplingSettings(temp=0.8, top_p=0.95, seed=7 + i) for i in range(3)
    ]
    opts = {"mode": "hint", "predictor": "init"}
    ref = [run(alone(path, PROMPT, 8, sampling=s, **opts)) for s in samplings]
    got, rows, step = run(batched(path, [PROMPT] * 3, [8] * 3, [0] * 3, 3, samplings, **opts))
    assert got == ref
    assert len({tuple(t) for t in ref}) > 1  # the seeds differ: so do the choices
    assert step.stacked is True and rows.count(3) >= 5


def test_a_merged_row_refuses_its_stale_cache(runtime_stores: dict[str, Path]) -> None:
    """While a row's cache is in the stack its runner holds placeholders that raise."""
    with pytest.raises(Edge0Error, match="merged into a batched step"):
        _ = HeldCache().offset
    path = runtime_stores["qwen3_moe"]
    seen: list[bool] = []

    real = batch.BatchStep._run_stacked

    def spy(self: Any, rows: list[Any], tokens: list[int]) -> Any:
        out = real(self, rows, tokens)
        seen.append(all(isinstance(c, HeldCache) for r in rows for c in r.runner.cache))
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(batch.BatchStep, "_run_stacked", spy)
    try:
        run(batched(path, PROMPTS[:2], [6, 6], [0, 0], 2, mode="reactive"))
    finally:
        mp.undo()
    assert seen and all(seen)


def test_the_greenlet_path_decodes_as_alone_where_rows_cannot_stack(
    runtime_stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model refused by `stack_refusal` runs each row's forward as a greenlet, exactly."""
    monkeypatch.setattr(batch, "stack_refusal", lambda model: "refused by the test")
    path = runtime_stores["qwen3_5_moe"]
    opts = {"mode": "route", "predictor": "init"}
    ns, after = [10, 6, 9], [0, 0, 3]
    ref = [run(alone(path, p, n, **opts)) for p, n in zip(PROMPTS[:3], ns, strict=True)]
    got, rows, step = run(batched(path, PROMPTS[:3], ns, after, 3, **opts))
    assert got == ref
    assert step.stacked is False and step.stack.merges == 0 and 3 in rows
