"""Chunked prefill equals one-token prefill (log-probs, greedy tokens) in every mode; reads once."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from conftest import FIXTURES, MODEL_TYPES
from runtime_helpers import MockTier, Recording, build_store

from edge0.errors import ConfigError
from edge0.layout.convert import ConvertOptions, convert
from edge0.model.generate import SamplingSettings
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.slots import pool_size
from edge0.runtime.prefill import chunks as prefill
from edge0.runtime.prefill.chunk_moe import group_size
from edge0.synth.tiny_families import CONFIGS, fixture_file, write_family

PROMPT = [5, 17, 42, 7, 99, 3, 250, 31, 64, 12, 8, 77, 140, 9, 21, 33, 45, 101, 6, 88, 13, 2, 57]
N = 6  # generated tokens: the first from prefill, then N - 1 decode steps
OTHER_FAMILIES = tuple(mt for mt in CONFIGS if mt not in MODEL_TYPES)
MODES = [
    ("resident", None),
    ("reactive", None),
    ("hint", "init"),
    ("route", "init"),
    ("route", "temporal"),  # a host-side predictor (no MLX graph)
    ("route", "heads"),  # random heads whose temporal inputs (multi-hot t, t-1) matter
]


def with_random_heads(store: Path, dest: Path) -> Path:
    """A copy of `store` with prerouter heads whose every weight is random (seeded)."""
    import shutil

    from mlx.utils import tree_flatten, tree_unflatten

    from edge0.layout.load import load_layout
    from edge0.routing.prerouter import PrerouterSet

    shutil.copytree(store, dest)
    heads = PrerouterSet.from_model(load_layout(dest, experts="none").model)
    mx.random.seed(0)
    for head in heads.heads.values():
        flat: Any = tree_flatten(head.parameters())
        # the multi-hot columns dominate: a wrong temporal input changes the prediction
        scale = {"lin_m.weight": 10.0}
        head.update(
            tree_unflatten([(n, scale.get(n, 0.1) * mx.random.normal(v.shape)) for n, v in flat])
        )
    heads.save(dest)
    return dest


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prefill-stores")
    out = {mt: build_store(root, mt) for mt in MODEL_TYPES}
    for mt in OTHER_FAMILIES:  # the committed tiny fixtures of every other supported family
        hf = write_family(fixture_file(FIXTURES, mt), root / mt / "hf")
        convert(hf, root / mt / "e0", ConvertOptions(group_size=32))
        out[mt] = root / mt / "e0"
    for mt in MODEL_TYPES:
        out[f"{mt}+heads"] = with_random_heads(out[mt], root / f"{mt}-heads")
    return out


async def generate(path: Path, prompt: list[int], chunk: int, **opts: Any) -> dict[str, Any]:
    if opts.get("mode") != "resident":
        opts.setdefault("tiers", MockTier(path))
    rec = Recording()
    greedy = SamplingSettings(hooks=rec)
    async with Engine.open(path, prefill_chunk=chunk, **opts) as eng:
        toks = [t async for t in eng.tokens(prompt, max_tokens=N, stop=False, sampling=greedy)]
        # the log-probabilities of the prefill's last forward, then of every decode step
        logprobs = np.stack([np.array(a.reshape(-1)) for a in rec.seen[-N:]])
        return {"tokens": toks, "logprobs": logprobs, "engine": eng, "stats": eng.last_stats}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("family", MODEL_TYPES)
@pytest.mark.parametrize(("mode", "predictor"), MODES)
def test_chunked_prefill_equals_one_token(
    stores: dict[str, Path], family: str, mode: str, predictor: str | None
) -> None:
    path = stores[f"{family}+heads" if predictor == "heads" else family]
    one = run(generate(path, PROMPT, 1, mode=mode, predictor=predictor))
    # 23 tokens in chunks of 8, 8, 7; and of 11, 11, 1 (a trailing one-token step)
    for chunk in (8, 11):
        got = run(generate(path, PROMPT, chunk, mode=mode, predictor=predictor))
        assert got["tokens"] == one["tokens"], chunk
        np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)
        prefill_steps = [r for r in got["engine"].setup.ctx.records if r.prefill]
        assert len(prefill_steps) == 3
    if mode == "route":  # the first decode step is routed by the last prompt token's prediction
        ctx = got["engine"].setup.ctx
        assert ctx.routed_by_prediction == one["engine"].setup.ctx.routed_by_prediction > 0


@pytest.mark.parametrize("k", [1, 3])
def test_chunked_prefill_other_capacities(stores: dict[str, Path], k: int) -> None:
    """K=1 stages one expert per group (8 groups); K=3 groups of 3 over 8 experts."""
    path = stores[MODEL_TYPES[0]]
    one = run(generate(path, PROMPT, 1, mode="reactive", top_k=k))
    got = run(generate(path, PROMPT, 23, mode="reactive", top_k=k))
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("first", ["resident", "wrap", "reactive"])
def test_chunked_prefill_first_layer_policies(stores: dict[str, Path], first: str) -> None:
    path = stores["qwen3_5_moe"] if "qwen3_5_moe" in stores else stores[MODEL_TYPES[0]]
    one = run(generate(path, PROMPT, 1, mode="route", predictor="init", first_layer=first))
    got = run(generate(path, PROMPT, 8, mode="route", predictor="init", first_layer=first))
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)


def test_each_expert_read_once_per_chunk(stores: dict[str, Path]) -> None:
    """Reactive, one chunk for the whole prompt: every layer reads exactly its prompt union."""
    path = stores[MODEL_TYPES[0]]
    tier = MockTier(path)

    async def go() -> tuple[Any, int]:
        async with Engine.open(
            path, tiers=tier, mode="reactive", prefill_chunk=len(PROMPT), record_routing=True
        ) as eng:
            got = [t async for t in eng.tokens(PROMPT, max_tokens=1, stop=False)]
            assert len(got) == 1
            return eng, len(tier.reads)

    eng, n_reads = run(go())
    rec = eng.setup.ctx.recording
    streamed = sorted({layer for _, layer in rec} - set(eng.setup.ctx.resident_experts))
    want = {
        layer: {e for pos in range(len(PROMPT)) for e in rec[(pos, layer)]} for layer in streamed
    }
    reads: dict[int, list[int]] = {}
    for key in tier.reads[:n_reads]:
        reads.setdefault(key.layer, []).append(key.expert)
    for layer in streamed:
        assert sorted(reads[layer]) == sorted(want[layer]), layer  # each once, nothing else
    # more than one group's worth: the union was staged in groups (sub-steps)
    memory = eng.setup.ctx.memory
    g = group_size(memory.n_slots, len(streamed), eng.setup.ctx.top_k)
    assert max(len(u) for u in want.values()) > g


@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("layers", [1, 2, 5, 40])
def test_group_fits_the_shared_pool(k: int, layers: int) -> None:
    """A group and the next one's prefetch fit while every other layer holds K slots."""
    for extra in (0, 1, 7):
        n = pool_size(k, layers, extra=extra)
        g = group_size(n, layers, k)
        assert g >= k and 2 * g + k * (layers - 1) <= n, (n, g)
    assert group_size(pool_size(k, layers), layers, k) == 3 * k // 2  # the default pool


def test_bad_chunk_is_a_config_error(stores: dict[str, Path]) -> None:
    path = stores[MODEL_TYPES[0]]

    async def go() -> None:
        async with Engine.open(path, tiers=MockTier(path), prefill_chunk=0):
            pass

    with pytest.raises(ConfigError, match=r"--prefill-chunk \(prefill_chunk=\) must be at least 1"):
        run(go())


def test_prefill_leaves_the_first_decode_set_staged(stores: dict[str, Path]) -> None:
    """Route, one chunk: the prompt reads each layer's union once; after it, the first decode
    step's prefetch reads the predicted experts the prompt never used, and again only those
    that later layers' groups rewrote in the shared pool (never the last layer's: its
    predicted set is staged last and nothing stages after it)."""
    path = stores[MODEL_TYPES[0]]
    tier = MockTier(path)

    async def go() -> tuple[Any, int, dict[int, tuple[int, list[int]]]]:
        async with Engine.open(
            path,
            tiers=tier,
            mode="route",
            predictor="init",
            prefill_chunk=len(PROMPT),
            record_routing=True,
        ) as eng:
            agen = eng.tokens(PROMPT, max_tokens=3, stop=False)
            await agen.__anext__()  # the prefill is done, the first decode step not started
            assert eng.setup.scheduler is not None
            issued, plans = eng.setup.scheduler.stats.issued, eng.setup.ctx.predictions()
            async for _ in agen:
                pass
            return eng, issued, plans

    eng, issued, plans = run(go())
    rec = eng.setup.ctx.recording
    streamed = sorted({layer for _, layer in rec} - set(eng.setup.ctx.resident_experts))
    union = {n: {e for p in range(len(PROMPT)) for e in rec[(p, n)]} for n in streamed}
    assert set(plans) == set(streamed)  # every streamed layer is planned for the first step
    reads: dict[tuple[int, int], int] = {}
    for key in tier.reads[:issued]:
        reads[(key.layer, key.expert)] = reads.get((key.layer, key.expert), 0) + 1
    for layer in streamed:
        planned = set(plans[layer][1])
        for e in union[layer] | planned:
            again = e in union[layer] and e in planned and layer != streamed[-1]
            assert 1 <= reads.get((layer, e), 0) <= 1 + int(again), (layer, e)
    assert sum(reads.values()) == issued  # nothing outside the unions and the plans
    assert all(k[1] in union[k[0]] | set(plans[k[0]][1]) for k in reads)


@pytest.mark.parametrize("family", MODEL_TYPES)
def test_head_runs_on_the_last_position_only(loaded_model: Any, family: str) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    from edge0.runtime.prefill.chunks import last_position_only

    model = loaded_model(family).model
    ids = mx.array([PROMPT[:9]])
    full = model(ids, cache=make_prompt_cache(model))  # (1, 9, vocab)
    with last_position_only(model):
        last = model(ids, cache=make_prompt_cache(model))
    assert last.shape == (1, 1, full.shape[-1])
    np.testing.assert_allclose(np.array(last[0, -1]), np.array(full[0, -1]), atol=1e-5, rtol=0)
    assert model(ids, cache=make_prompt_cache(model)).shape == full.shape  # restored


@pytest.mark.parametrize("family", OTHER_FAMILIES)
@pytest.mark.parametrize(("mode", "predictor"), [("reactive", None), ("route", "init")])
def test_chunked_prefill_every_family(
    stores: dict[str, Path], family: str, mode: str, predictor: str | None
) -> None:
    """Every other supported family (tiny fixtures): chunks of 8 equal one-token prefill."""
    path = stores[family]
    one = run(generate(path, PROMPT, 1, mode=mode, predictor=predictor))
    got = run(generate(path, PROMPT, 8, mode=mode, predictor=predictor))
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", MODEL_TYPES + OTHER_FAMILIES)
def test_dequantized_chunk_equals_one_token(
    stores: dict[str, Path], family: str, monkeypatch: pytest.MonkeyPatch, mlx_only: None
) -> None:
    """Without the native kernels, every resident linear and every expert of a chunk
    dequantized (thresholds at one row), the recurrent layers in pieces of 3 with their
    projections over the whole chunk: the logits and greedy tokens still equal one-token
    prefill's (which keeps the int4 kernels)."""
    from edge0.runtime.prefill import chunk_moe
    from edge0.runtime.prefill import dense as prefill_dense
    from edge0.runtime.prefill import memory as prefill_memory

    path = stores[family]
    one = run(generate(path, PROMPT, 1, mode="reactive"))
    calls = {"experts": 0, "linears": 0}
    real_expert, real_swap = chunk_moe.dense_expert, prefill_dense.dense_linears

    def expert(*a: Any) -> Any:
        calls["experts"] += 1
        return real_expert(*a)

    @contextlib.contextmanager
    def swap(model: Any, rows: int | None = None) -> Any:
        with real_swap(model, rows) as n:
            calls["linears"] += n
            yield n

    monkeypatch.setattr(chunk_moe, "dense_expert", expert)
    monkeypatch.setattr(prefill, "dense_linears", swap)
    monkeypatch.setattr(prefill_dense, "DENSE_ROWS", 1)
    monkeypatch.setattr(chunk_moe, "DENSE_EXPERT_ROWS", 1)
    monkeypatch.setattr(prefill_memory, "SUB_TOKENS", 3)
    got = run(generate(path, PROMPT, 11, mode="reactive"))
    assert calls["experts"] > 0 and calls["linears"] > 0
    assert got["tokens"] == one["tokens"]
    np.testing.assert_allclose(got["logprobs"], one["logprobs"], atol=1e-4, rtol=0)


def test_dense_chunk_linear_matches_the_int4_kernel(mlx_only: None) -> None:
    """Many rows: dequantized weight and one matmul (fp32 summation order only); few rows: the
    int4 kernel itself. `dense_linears` swaps quantized linears in and restores them."""
    import mlx.nn as nn

    from edge0.runtime.prefill.dense import DenseChunkLinear, dense_linears

    mx.random.seed(1)
    q = nn.QuantizedLinear.from_linear(nn.Linear(64, 48, bias=True), group_size=32, bits=4)
    dense = DenseChunkLinear(q, rows=8)
    many, few = mx.random.normal((2, 20, 64)), mx.random.normal((1, 7, 64))
    np.testing.assert_allclose(np.array(dense(many)), np.array(q(many)), atol=1e-5, rtol=0)
    assert mx.array_equal(dense(few), q(few))
    outer = nn.Sequential(q, nn.Linear(48, 4))
    with dense_linears(outer, rows=8) as n:
        assert n == 1 and isinstance(outer.layers[0], DenseChunkLinear)
    assert outer.layers[0] is q
    with dense_linears(outer, rows=0) as n:
        assert n == 0 and outer.layers[0] is q


def test_wide_experts_keep_the_int4_kernel(monkeypatch: pytest.MonkeyPatch, mlx_only: None) -> None:
    """An expert whose projection would dequantize to more than DENSE_MAX_BYTES of fp32 (a
    Llama-4 Scout expert: 5120 x 8192, 160 MiB each) runs in gather_qmm; narrow ones, and
    per-projection bits (an 8-bit down_proj packs 4 values a word), are measured as such."""
    from types import SimpleNamespace

    from edge0.runtime.prefill import chunk_moe
    from edge0.runtime.prefill import dense as prefill_dense

    monkeypatch.setattr(chunk_moe, "on_cpu", lambda: True)

    def block(out: int, d: int, quant: dict[str, Any]) -> Any:
        def w(o: int, i: int, bits: int) -> mx.array:
            return mx.zeros((2, o, i * bits // 32), mx.uint32)

        bits = chunk_moe.projection_quant
        views = {
            "gate_proj.weight": w(out, d, bits(quant, "gate_proj")["bits"]),
            "up_proj.weight": w(out, d, bits(quant, "up_proj")["bits"]),
            "down_proj.weight": w(d, out, bits(quant, "down_proj")["bits"]),
        }
        return SimpleNamespace(stream=SimpleNamespace(quant=quant, views=views))

    int4 = {"bits": 4, "group_size": 64}
    assert chunk_moe.dense_experts_ok(block(512, 2048, int4))  # the 35B shape: 4 MiB each
    assert not chunk_moe.dense_experts_ok(block(8192, 5120, int4))  # Scout: 160 MiB each
    assert not chunk_moe.dense_experts_ok(block(512, 2048, {**int4, "mode": "mxfp4"}))
    edge = prefill_dense.DENSE_MAX_BYTES // 4 // 2048  # rows at exactly the cap
    assert chunk_moe.dense_experts_ok(block(edge, 2048, int4))
    assert not chunk_moe.dense_experts_ok(block(edge + 64, 2048, int4))
    mixed = {**int4, "projections": {"down_proj": {"bits": 8, "group_size": 64}}}
    assert chunk_moe.dense_experts_ok(block(edge, 2048, mixed))
    monkeypatch.setattr(chunk_moe, "DENSE_EXPERT_ROWS", 0)
    assert not chunk_moe.dense_experts_ok(block(512, 2048, int4))
