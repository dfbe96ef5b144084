"""The slot pool's scale dtypes: kept as stored where the native expert FFN reads them, widened
into a float32 sidecar where MLX's gather_qmm computes; same tokens, more slots a budget."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from runtime_helpers import PROMPT, MockTier

import edge0.runtime.setup.build as build
import edge0.runtime.setup.prepare as prepare
from edge0.errors import ConfigError
from edge0.kernels import native as kernels
from edge0.layout.manifest import Manifest
from edge0.options.engine import EngineOptions
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.plan.footprint import footprint
from edge0.runtime.plan.memory import plan

FAMILIES = ["qwen3_moe", "qwen3_5_moe"]
PROMPTS = [PROMPT, [9, 3, 77, 12]]
NARROW = ("bfloat16", "float16")
BASE = 200 << 20  # the process baseline the plan is told (build.current_rss_bytes)


@pytest.fixture(scope="module")
def stores(runtime_stores: dict[str, Path]) -> dict[str, Path]:
    return {mt: runtime_stores[mt] for mt in FAMILIES}


@pytest.fixture
def widens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The slots `SlotMemory.widen` is called for (reader threads, loop workers, RAM copies)."""
    calls: list[int] = []
    widen = SlotMemory.widen

    def counted(self: SlotMemory, slot: int) -> None:
        calls.append(slot)
        widen(self, slot)

    monkeypatch.setattr(SlotMemory, "widen", counted)
    return calls


def widen_every_narrow_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool MLX's gather_qmm path holds (bf16/fp16 fields as float32), with the native
    expert FFN still computing: the reference the kept dtypes must match bit for bit."""

    def wide(model: Any, manifest: Manifest) -> dict[str, mx.Dtype]:
        held = SLOT_DTYPES(model, manifest)
        return {f.name: mx.float32 if f.dtype in NARROW else held[f.name] for f in manifest.fields}

    monkeypatch.setattr(prepare, "slot_dtypes", wide)


SLOT_DTYPES = prepare.slot_dtypes


def tier_for(path: Path, tier: str) -> Any:
    return MockTier(path) if tier == "mock" else tier


async def decode(
    path: Path, prompts: list[list[int]], n: int, tier: str = "mock", **opts: Any
) -> tuple[list[list[int]], SlotMemory | None]:
    """Each prompt's `n` tokens, together (batched when `max_batch` > 1), and the slot pool."""
    async with Engine.open(path, tiers=tier_for(path, tier), **opts) as eng:

        async def one(prompt: list[int]) -> list[int]:
            return [t async for t in eng.tokens(prompt, max_tokens=n, stop=False)]

        got = await asyncio.gather(*(one(p) for p in prompts))
        if opts.get("max_batch", 1) > 1:
            assert eng.batcher is not None and max(s.rows for s in eng.batcher.log) > 1
        return list(got), eng.setup.ctx.memory


def scale_dtypes(memory: SlotMemory | None) -> set[mx.Dtype]:
    assert memory is not None
    return {v.dtype for k, v in memory.pool.items() if k.endswith(("scales", "biases"))}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["hint", "route"])
@pytest.mark.parametrize(
    "tier, batch", [("mock", 1), ("pread", 1), ("ram:4MiB>pread", 1), ("mock", 2)]
)
def test_stored_scales_decode_the_widened_pools_tokens(
    stores: dict[str, Path],
    family: str,
    mode: str,
    tier: str,
    batch: int,
    widens: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the native expert FFN the pool views the records' bf16 scales and biases: no
    sidecar, no widen after a read, and every token of a single or batched decode equals the
    widened pool's (and, in hint, resident mode's)."""
    path = stores[family]
    prompts = PROMPTS[:batch]
    opts: dict[str, Any] = dict(mode=mode, predictor="init", max_batch=batch)
    kept, memory = asyncio.run(decode(path, prompts, 10, tier, **opts))
    assert scale_dtypes(memory) == {mx.bfloat16}
    assert memory is not None and memory.widened == () and memory._side is None
    assert widens == []
    manifest = Manifest.load(path)
    assert memory.nbytes == memory.n_slots * manifest.record_size + 4096  # records only
    widen_every_narrow_field(monkeypatch)
    wide, wide_memory = asyncio.run(decode(path, prompts, 10, tier, **opts))
    assert scale_dtypes(wide_memory) == {mx.float32} and widens
    assert wide_memory is not None and wide_memory.nbytes > memory.nbytes
    assert kept == wide
    if mode == "hint":
        resident = [asyncio.run(decode(path, [p], 10, mode="resident"))[0][0] for p in prompts]
        assert kept == resident


@pytest.mark.parametrize("mode", ["hint", "route"])
def test_mlx_s_gather_qmm_still_gets_the_widened_pool(
    stores: dict[str, Path], mode: str, widens: list[int], mlx_only: None
) -> None:
    """Without the native kernels the pool widens bf16 scales and biases into its float32
    sidecar after each read, counted by the plan, and hint still decodes resident's tokens."""
    path = stores["qwen3_5_moe"]
    manifest = Manifest.load(path)
    got, memory = asyncio.run(decode(path, [PROMPT], 10, mode=mode, predictor="init"))
    assert scale_dtypes(memory) == {mx.float32} and widens
    assert memory is not None
    assert set(memory.widened) == {f.name for f in manifest.fields if f.dtype in NARROW}
    fp = footprint(path, manifest, EngineOptions(mode=mode, predictor="init"), 0)
    assert memory.nbytes == memory.n_slots * fp.slot + 4096
    if mode == "hint":
        assert got == asyncio.run(decode(path, [PROMPT], 10, mode="resident"))[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_same_budget_buys_more_slots_with_stored_scales(
    runtime_store_root: Path,
    family: str,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """The plan counts a slot at its record's size where the native kernels read the scales
    (a float32 sidecar where MLX computes): one budget plans more slots, and the engine holds
    the slots it planned, byte for byte."""
    from runtime_helpers import build_store

    path = build_store(runtime_store_root, family, experts=64)  # a pool short of the store
    manifest = Manifest.load(path)
    opts = dict(mode="route", predictor="init", context=100)
    monkeypatch.setattr(build, "current_rss_bytes", lambda: BASE)

    def planned_and_held(budget: int) -> tuple[Any, int, int]:
        async def main() -> tuple[Any, int, int]:
            async with Engine.open(path, tiers="pread", memory_budget=budget, **opts) as eng:
                reads = eng.setup.scheduler
                assert reads is not None
                return eng.setup.memory_plan, reads.table.n_slots, reads.memory.nbytes

        return asyncio.run(main())

    native = footprint(path, manifest, EngineOptions(**opts), BASE)
    request.getfixturevalue("mlx_only")
    mlx = footprint(path, manifest, EngineOptions(**opts), BASE)
    side = sum(2 * f.nbytes for f in manifest.fields if f.dtype in NARROW)  # as float32
    assert native.slot == manifest.record_size and mlx.slot == manifest.record_size + side
    budget = smallest_budget(mlx) + 6 * mlx.slot
    on_mlx = plan(budget, mlx)
    on_native = plan(budget, native)
    assert on_mlx.resident_layers == on_native.resident_layers == 0  # slots, not layers
    assert on_native.n_slots > on_mlx.n_slots
    assert on_native.n_slots >= on_mlx.n_slots * mlx.slot // native.slot  # the sidecar's bytes
    p, n_slots, held = planned_and_held(budget)  # MLX's ops: the sidecar
    assert (p.n_slots, p.slots) == (on_mlx.n_slots, on_mlx.slots) == (n_slots, held)
    monkeypatch.setenv("EDGE0_NATIVE_KERNELS", "1")
    kernels.reset()
    p, n_slots, held = planned_and_held(budget)
    assert (p.n_slots, p.slots) == (on_native.n_slots, on_native.slots) == (n_slots, held)
    assert f"({on_native.n_slots} slots)" in p.line()


def smallest_budget(fp: Any) -> int:
    """The least budget the plan accepts for footprint `fp` (1 MiB steps)."""
    lo, hi = 0, 1 << 34
    while hi - lo > 1 << 20:
        mid = (lo + hi) // 2
        try:
            plan(mid, fp)
            hi = mid
        except ConfigError:
            lo = mid
    return hi


def test_the_kernel_reads_kept_scales_of_a_two_dimensional_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool past MLX's int32 dimensions views its bf16 fields through uint32 words: the
    native expert FFN reads them there as it does in a flat pool and in a widened one."""
    import numpy as np
    from mlx_lm.models.switch_layers import SwiGLU
    from runtime_helpers import build_store

    import edge0.runtime.io.slotmem as slotmem
    from edge0.kernels.ops import expert_ffn
    from edge0.layout.manifest import EXPERTS_FILE
    from edge0.runtime.layers.block import ffn_plan

    store = build_store(tmp_path, "qwen3_5_moe", moe_ff=64)  # bf16 fields of even width
    manifest = Manifest.load(store)
    layers = list(manifest.moe_layers)
    data = np.fromfile(store / EXPERTS_FILE, dtype=np.uint8)
    wide = {f.name: mx.float32 for f in manifest.fields}
    d_model = next(f.shape[-1] for f in manifest.fields if f.name == "up_proj.weight") * 8
    x = mx.random.normal((1, 1, 1, d_model), key=mx.random.key(0))  # 4-bit: 8 a word
    idx = mx.array([[[1, 4, 5]]], dtype=mx.uint32)
    outs = []
    for limit, dtypes in ((slotmem.DIM_LIMIT, None), (0, None), (slotmem.DIM_LIMIT, wide)):
        monkeypatch.setattr(slotmem, "DIM_LIMIT", limit)  # 0: 2-D
        mem = slotmem.SlotMemory(manifest, layers, 6, dtypes)
        for slot in range(6):
            start = manifest.record_offset(layers[0], slot)
            np.frombuffer(mem.dest(layers[0], slot), dtype=np.uint8)[:] = data[
                start : start + manifest.record_size
            ]
            if mem.widened:
                mem.widen(slot)
        up, gate, down = ffn_plan(manifest.quantization, mem.pool)
        y = expert_ffn(x, idx, up, gate, down, SwiGLU())
        assert y is not None  # the native op ran
        outs.append(y)
    flat, two_d, widened = outs
    assert mx.array_equal(flat, two_d).item() and mx.array_equal(flat, widened).item()
