"""A prompt chunk on the native kernels: no weight dequantized, every expert group one native op.

The GEMM (tests/test_kernels_gemm.py) decodes each weight row once for all of a chunk's
rows, so the dequantized fp32 paths (edge0.runtime.prefill.dense, chunk_moe.dense_expert)
are for MLX's own kernels only. With the native kernels a chunk must run none of them, and
its logits and greedy tokens must still equal one-token prefill's.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import MODEL_TYPES
from runtime_helpers import MockTier, build_store

from edge0.kernels import native
from edge0.runtime.engine.api import Engine
from edge0.runtime.layers import block as layer_block
from edge0.runtime.prefill import chunk_moe
from edge0.runtime.prefill import chunks as prefill
from edge0.runtime.prefill import dense as prefill_dense

PROMPT = [5, 17, 42, 7, 99, 3, 250, 31, 64, 12, 8, 77, 140, 9, 21, 33, 45, 101, 6, 88, 13, 2, 57]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("prefill-native"), MODEL_TYPES[0])


async def _tokens(path: Path, chunk: int) -> list[int]:
    async with Engine.open(path, tiers=MockTier(path), mode="reactive", prefill_chunk=chunk) as eng:
        return [t async for t in eng.tokens(PROMPT, max_tokens=6, stop=False)]


def test_a_chunk_dequantizes_nothing_on_the_native_kernels(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert native.module() is not None, native.status()
    calls = {"dense_experts": 0, "dense_linears": 0, "native_ffn_rows": []}
    real_expert, real_swap = chunk_moe.dense_expert, prefill_dense.dense_linears
    real_ffn = layer_block.native_expert_ffn

    def expert(*a: Any) -> Any:
        calls["dense_experts"] += 1
        return real_expert(*a)

    @contextlib.contextmanager
    def swap(model: Any, rows: int | None = None) -> Any:
        with real_swap(model, rows) as n:
            calls["dense_linears"] += n
            yield n

    def ffn(h: Any, idx: Any, *a: Any) -> Any:
        out = real_ffn(h, idx, *a)
        assert out is not None  # the native op ran
        calls["native_ffn_rows"].append(idx.size)
        return out

    one = asyncio.run(_tokens(store, 1))
    monkeypatch.setattr(chunk_moe, "dense_expert", expert)
    monkeypatch.setattr(prefill, "dense_linears", swap)
    monkeypatch.setattr(layer_block, "native_expert_ffn", ffn)
    got = asyncio.run(_tokens(store, len(PROMPT)))
    assert got == one
    assert calls["dense_experts"] == 0 and calls["dense_linears"] == 0
    assert max(calls["native_ffn_rows"]) > 8  # a group's pairs in one op: the GEMM's range


def test_without_the_native_kernels_a_chunk_still_dequantizes(
    store: Path, mlx_only: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback keeps the dequantized paths (MLX's int4 kernel unpacks per row)."""
    seen = {"dense": 0}
    real_swap = prefill_dense.dense_linears

    @contextlib.contextmanager
    def swap(model: Any, rows: int | None = None) -> Any:
        with real_swap(model, rows) as n:
            seen["dense"] += n
            yield n

    monkeypatch.setattr(prefill, "dense_linears", swap)
    got = asyncio.run(_tokens(store, len(PROMPT)))
    assert len(got) == 6 and seen["dense"] > 0
    assert np.all(np.array(got) >= 0)


def test_the_demo_continues_a_prompt_alike_chunked_and_one_token() -> None:
    """The demo model, a 207-token prompt: chunked (the GEMM, native attention over the
    chunk) and one token per step give the same greedy continuation."""
    from edge0.bench.worker import encode_prompts
    from edge0.model.demo import default_model_path

    async def go(chunk: int) -> list[int]:
        async with Engine.open(default_model_path(), prefill_chunk=chunk, tiers="pread") as eng:
            ids = encode_prompts(eng.tokenizer, 1, 207)[0]
            return [t async for t in eng.tokens(ids, max_tokens=12, stop=False)]

    assert asyncio.run(go(256)) == asyncio.run(go(1))
