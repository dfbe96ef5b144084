"""Loading resident experts: the layer is held once, and the plan counts what loading adds."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from runtime_helpers import build_store

from edge0.errors import ConfigError
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.load import expert_dtypes, read_expert_stacks
from edge0.layout.manifest import EXPERTS_FILE, Manifest
from edge0.layout.records import field_views
from edge0.layout.safetensors_io import MX_DTYPES
from edge0.options.engine import EngineOptions
from edge0.runtime.plan.footprint import footprint
from edge0.runtime.plan.memory import (
    WORKING_BASE,
    WORKING_PER_1K_D,
    Footprint,
    attention_layers,
    kv_bytes,
    load_bytes,
    plan,
    working_bytes,
)
from edge0.synth.forms import derived
from edge0.synth.tiny_families import fixture_file, write_family

FIXTURES = Path(__file__).parent / "fixtures"

_MIB = 1 << 20


@pytest.fixture(scope="module", params=["qwen3_5_moe", "gpt_oss_mxfp4"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("load")
    if request.param == "gpt_oss_mxfp4":  # MXFP4 records: uint8 scales, bf16 biases
        hf = write_family(fixture_file(FIXTURES, "gpt_oss"), root / "hf")
        convert(
            derived("gpt_oss_mxfp4", hf, root / "hub"), root / "e0", ConvertOptions(group_size=32)
        )
        return root / "e0"
    return build_store(root, str(request.param))


def test_a_resident_layer_is_read_into_its_stacks_without_a_second_copy(store: Path) -> None:
    manifest = Manifest.load(store)
    layer = manifest.moe_layers[0]
    tracemalloc.start()  # numpy's buffers are traced; MLX's are not
    try:
        stacks = read_expert_stacks(store, manifest, layer)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    layer_bytes = manifest.n_experts * manifest.record_size
    assert peak < 2 * manifest.record_size < layer_bytes  # one record and change, not the layer
    data = np.fromfile(store / EXPERTS_FILE, dtype=np.uint8)
    for e in (0, manifest.n_experts - 1):  # the stacks hold the records' bytes, unchanged
        start = manifest.record_offset(layer, e)
        record = data[start : start + manifest.record_size]
        for name, view in field_views(manifest, record).items():
            got = stacks[name][e]
            if got.dtype == mx.bfloat16:
                got = got.view(mx.uint16)
            assert np.array_equal(np.asarray(got), view), (name, e)


def test_the_load_term_comes_from_the_record_layout(store: Path) -> None:
    manifest = Manifest.load(store)
    narrow = [
        int(np.prod(f.shape)) * 2 for f in manifest.fields if f.dtype in ("bfloat16", "float16")
    ]
    assert narrow  # both layouts have bf16 fields (scales and biases, or biases)
    want = manifest.record_size + manifest.n_experts * max(narrow)
    wide = {f.name: mx.float32 for f in manifest.fields}
    stored = {f.name: MX_DTYPES[f.dtype] for f in manifest.fields}
    assert load_bytes(manifest, wide) == want
    assert load_bytes(manifest, stored) == manifest.record_size  # nothing is widened
    kept = footprint(store, manifest, EngineOptions(first_layer="resident"), 0)
    wrap = footprint(store, manifest, EngineOptions(first_layer="wrap"), 0)
    every = footprint(store, manifest, EngineOptions(mode="resident"), 0)
    held = expert_dtypes(store, manifest, mx.float32)  # the native kernels read scales as stored
    widened = [f for f in manifest.fields if held[f.name] != stored[f.name]]
    assert not any(f.name.endswith(("scales", "biases")) for f in widened)
    bigger = max((int(np.prod(f.shape)) * 2 for f in widened), default=0)
    assert kept.load == every.load == manifest.record_size + manifest.n_experts * bigger
    assert wrap.load == 0


def _fp(load: int) -> Footprint:
    return Footprint(
        resident=100 * _MIB,
        resident_experts=20 * _MIB,
        heads=0,
        slot=2 * _MIB,
        record=_MIB,
        layers=10,
        top_k=4,
        kv=0,
        state=0,
        working=20 * _MIB,
        overhead=80 * _MIB,
        load=load,
    )


def test_the_plan_refuses_a_budget_that_only_the_steady_state_fits() -> None:
    fixed = (100 + 20 + 4 * 12 * 2 + 20 + 80) * _MIB + 4096  # the pool's buffer is aligned
    assert plan(fixed, _fp(0)).load == 0
    got = plan(fixed + 7 * _MIB, _fp(7 * _MIB))
    assert got.load == 7 * _MIB and got.cache == 0 and got.extra_slots == 0
    assert "loading 7" in got.line()
    with pytest.raises(ConfigError, match=r"and loading \(7\) need"):
        plan(fixed + 7 * _MIB - 1, _fp(7 * _MIB))


def test_working_memory_adds_one_attention_layers_kv_cache() -> None:
    """mlx-lm grows one layer's cache at a time: working memory holds the largest layer's KV
    once (a config without `layer_types` has every layer attending over the whole context;
    a sliding layer's cache holds its window and one growth step)."""
    mixtral = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    }
    assert attention_layers(mixtral) == 32
    assert kv_bytes(mixtral, 4000) == 2 * 32 * 8 * 128 * 4096 * 4  # 256-token growth steps
    assert working_bytes(mixtral, 4000) == (
        WORKING_BASE + 4 * WORKING_PER_1K_D + kv_bytes(mixtral, 4000) // 32
    )
    gpt_oss = {
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
    }
    per_token = 2 * 8 * 64 * 4
    assert attention_layers(gpt_oss) == 12
    assert kv_bytes(gpt_oss, 256) == 24 * per_token * 256
    assert kv_bytes(gpt_oss, 4096) == 12 * per_token * (4096 + 128 + 256)  # windows bound
    assert working_bytes(gpt_oss, 256) - working_bytes(gpt_oss, 1) == 0  # one growth step
    assert working_bytes(gpt_oss, 4096) - working_bytes(gpt_oss, 256) == per_token * (4096 - 256)


def test_a_pool_past_mlx_int32_dimensions_is_two_dimensional_with_the_same_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edge0.runtime.io.slotmem as slotmem

    store = build_store(tmp_path, "qwen3_5_moe", moe_ff=64)  # bf16 fields of even width
    manifest = Manifest.load(store)
    layers = list(manifest.moe_layers)
    data = np.fromfile(store / EXPERTS_FILE, dtype=np.uint8)
    record = data[manifest.record_offset(layers[0], 1) :][: manifest.record_size]
    pools = []
    wide = {f.name: mx.float32 for f in manifest.fields}
    for limit, dtypes in ((slotmem.DIM_LIMIT, None), (0, None), (0, wide)):  # 0: 2-D
        monkeypatch.setattr(slotmem, "DIM_LIMIT", limit)
        mem = slotmem.SlotMemory(manifest, layers, 5, dtypes)  # float32: with the sidecar
        np.frombuffer(mem.dest(layers[0], 3), dtype=np.uint8)[:] = record
        mem.widen(3)
        pools.append(mem)
    flat, two_d, widened = pools
    assert two_d._buffer.ndim == 2 and flat._buffer.ndim == 1
    assert any(v.dtype == mx.bfloat16 for v in two_d.pool.values())  # built from words
    for name, view in flat.pool.items():
        assert mx.array_equal(view[3], two_d.pool[name][3]).item(), name
        assert mx.array_equal(view[3].astype(mx.float32), widened.pool[name][3]).item(), name
