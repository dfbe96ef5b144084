"""A prompt chunk's memory: the plan's prompt part, and the sub-chunked recurrence (exact)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from click.testing import CliRunner
from runtime_helpers import MockTier, build_store
from test_prefill import PROMPT, generate

from edge0.cli.main import main
from edge0.errors import ConfigError
from edge0.runtime.engine.api import Engine
from edge0.runtime.plan.chunk import DEFAULT_CHUNK
from edge0.runtime.plan.memory import Footprint, plan
from edge0.runtime.prefill import memory as prefill_memory
from edge0.runtime.prefill.dense import DENSE_MAX_BYTES, dense_weight_bytes
from edge0.runtime.prefill.memory import (
    SUB_TOKENS,
    bounded_recurrence,
    chunk_bytes_per_token,
    chunk_fixed_bytes,
)

MIB = 1 << 20
HYBRID = {
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "linear_key_head_dim": 128,
}


def footprint(fixed: int = 8 * MIB, token: int = MIB) -> Footprint:
    return Footprint(100 * MIB, 0, 0, MIB, MIB, 4, 2, 0, 0, 10 * MIB, 10 * MIB, fixed, token)


def fixed_parts(fp: Footprint) -> int:
    """What the plan's fixed parts take (a budget this much larger leaves the rest to slots)."""
    p = plan(64 << 30, fp, 1)  # one-token prompts: no chunk part
    pool = p.slots - p.extra_slots * fp.slot  # the minimum pool (aligned)
    return p.resident + p.heads + pool + p.kv + p.overhead + p.working + p.load


def test_plan_chooses_the_largest_chunk_in_its_share() -> None:
    fp = footprint()
    base = fixed_parts(fp)
    ample = plan(base + 2048 * MIB, fp)
    assert ample.prefill_chunk == DEFAULT_CHUNK and ample.prompt == (8 + DEFAULT_CHUNK) * MIB
    # the chunk's part came out of what buys slots (1 MiB each here)
    assert ample.extra_slots * fp.slot == 2048 * MIB - ample.prompt
    tight = plan(base + 100 * MIB, fp)  # half of the 100 MiB left: 8 fixed + 42 tokens
    assert (tight.prefill_chunk, tight.prompt) == (42, 50 * MIB)
    assert tight.extra_slots * fp.slot == 50 * MIB  # the other half
    assert "prompt chunk 50 (42 tokens)" in tight.line()
    none = plan(base + 10 * MIB, fp)  # half of 10 MiB is below the 8 MiB a chunk always holds
    assert (none.prefill_chunk, none.prompt, none.extra_slots * fp.slot) == (1, 0, 10 * MIB)


def test_plan_keeps_an_asked_chunk_or_names_the_fix() -> None:
    fp = footprint()
    base = fixed_parts(fp)
    assert plan(base + 100 * MIB, fp, 92).prompt == 100 * MIB  # exactly what is left
    assert plan(base + 100 * MIB, fp, 1).prompt == 0  # one token: decode's working memory
    with pytest.raises(ConfigError) as err:
        plan(base + 100 * MIB, fp, 256)
    msg = str(err.value)
    assert "--prefill-chunk 256 needs 264 MiB" in msg and "leaves 100 MiB" in msg
    assert "use --prefill-chunk 92 or less, or raise the budget" in msg and "\n" not in msg


def test_chunk_estimate_from_the_config() -> None:
    state = 32 * 128 * 128 * 4  # one Gated DeltaNet state of the 35B-A3B shape: 2 MiB
    # two fp32 copies of the widest resident projection (dense chunk linears): here attention's
    # gated q (2 x 16 heads x 128) = 4096 wide; the 35B-A3B shape's q/k/v (8192) hits the cap
    dense = 2 * 4096 * 2048 * 4
    assert dense_weight_bytes(HYBRID) == dense
    assert chunk_fixed_bytes({"text_config": HYBRID}) == (SUB_TOKENS + 2) * state + dense
    assert chunk_fixed_bytes({"hidden_size": 2048}) == 2 * 2048 * 2048 * 4  # no recurrent layers
    wide = {**HYBRID, "linear_num_key_heads": 16, "head_dim": 256}
    assert dense_weight_bytes(wide) == 2 * DENSE_MAX_BYTES == 2 * 8192 * 2048 * 4
    per = chunk_bytes_per_token(HYBRID, 4, 4096)
    assert per < state // 2  # the states are in the fixed part, not per token
    assert chunk_bytes_per_token(HYBRID, 4, 8192) - per == 2 * 16 * 4096 * 4  # attention scores
    assert chunk_bytes_per_token(HYBRID, 8, 4096) - per == 3 * 4 * 2048 * 4  # pair outputs


def test_pieces_equal_the_whole_layer(loaded_model: Any) -> None:
    """A Gated DeltaNet run 3 tokens at a time gives the outputs and cache of one call."""
    from mlx_lm.models.cache import make_prompt_cache

    model = loaded_model("qwen3_5_moe").model
    layer = next(i for i, ly in enumerate(model.layers) if hasattr(ly, "linear_attn"))
    inner = model.layers[layer].linear_attn
    x = mx.random.normal(
        (1, 10, model.layers[layer].input_layernorm.weight.shape[0]), key=mx.random.key(0)
    )
    whole, pieces = make_prompt_cache(model)[layer], make_prompt_cache(model)[layer]
    want = inner(x, None, whole)
    rows: dict[str, list[int]] = {"norm": [], "in_proj_qkv": [], "out_proj": []}

    class Spy(nn.Module):
        def __init__(self, name: str, real: nn.Module) -> None:
            super().__init__()
            self.name, self.real = name, real

        def __call__(self, h: mx.array, *rest: Any) -> mx.array:
            rows[self.name].append(h.shape[1])
            return self.real(h, *rest)

    with bounded_recurrence(model, 3):
        wrapped = model.layers[layer].linear_attn
        assert isinstance(wrapped, prefill_memory._Pieces) and wrapped.inner is inner
    assert model.layers[layer].linear_attn is inner  # restored
    real = {name: inner[name] for name in rows}
    try:
        for name in rows:
            setattr(inner, name, Spy(name, real[name]))
        got = prefill_memory._Pieces(inner, 3)(x, None, pieces)
    finally:
        for name, module in real.items():
            setattr(inner, name, module)
    assert rows["norm"] == [3, 3, 3, 1]  # the recurrence and what follows it: in pieces
    assert rows["in_proj_qkv"] == rows["out_proj"] == [10]  # the projections: once, whole
    assert all(inner[name] is module for name, module in real.items())  # restored
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5, rtol=0)
    for a, b in zip(pieces.cache, whole.cache, strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("prefill-memory"), "qwen3_5_moe")


def test_chunked_prefill_in_pieces_equals_one_token(
    hybrid: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Route, chunks of 11 run 3 recurrent tokens at a time: logits and greedy tokens exact."""
    seen: list[int] = []
    call = prefill_memory._Pieces.__call__

    def spy(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        seen.append(x.shape[1])
        return call(self, x, mask, cache)

    monkeypatch.setattr(prefill_memory, "SUB_TOKENS", 3)
    monkeypatch.setattr(prefill_memory._Pieces, "__call__", spy)
    one = asyncio.run(generate(hybrid, PROMPT, 1, mode="route", predictor="init"))
    assert seen == []  # one-token prefill never wraps the layers
    got = asyncio.run(generate(hybrid, PROMPT, 11, mode="route", predictor="init"))
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)
    assert seen and set(seen) == {11}  # both chunks of 11 went through the pieces


def test_the_budget_chooses_the_chunk(hybrid: Path) -> None:
    """Under --memory-budget without --prefill-chunk the plan's chunk runs; exact."""
    got = asyncio.run(
        generate(hybrid, PROMPT, None, mode="reactive", memory_budget="4GiB", tiers="pread")
    )  # type: ignore[arg-type]
    setup = got["engine"].setup
    assert setup.ctx.prefill_chunk == setup.memory_plan.prefill_chunk == DEFAULT_CHUNK
    assert setup.memory_plan.prompt > 0
    one = asyncio.run(generate(hybrid, PROMPT, 1, mode="reactive"))
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)


def test_a_chunk_over_the_budget_is_refused(hybrid: Path) -> None:
    async def go() -> None:
        async with Engine.open(
            hybrid, tiers=MockTier(hybrid), memory_budget="1GiB", prefill_chunk=1 << 20
        ):
            pass

    with pytest.raises(ConfigError, match=r"--prefill-chunk 1048576 needs \d+ MiB"):
        asyncio.run(go())
    res = CliRunner().invoke(
        main,
        ["run", str(hybrid), "-p", "hi", "--memory-budget", "1GiB", "--prefill-chunk", "1048576"],
    )
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("edge0: error: --prefill-chunk 1048576 needs")
    assert "or less, or raise the budget" in lines[0] and "Traceback" not in res.output
