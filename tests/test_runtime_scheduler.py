"""Scheduler and slot memory: zero-copy reads, ticket order, faults, loop lag, tracing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from runtime_helpers import PROMPT, MockTier

from edge0.errors import TierReadError
from edge0.layout.manifest import Manifest
from edge0.layout.records import field_views
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.tickets import DEMAND, PREFETCH, FetchTicket, TicketQueue
from edge0.storage.tier import ExpertKey, ReadInfo


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]  # the session's read-only store (conftest.py)


def test_slot_views_see_bytes_written_into_slot_memory(store: Path) -> None:
    manifest = Manifest.load(store)
    layer = manifest.moe_layers[0]
    mem = SlotMemory(manifest, [layer], n_slots=3)
    tier = MockTier(store)
    off = manifest.record_offset(layer, 5)
    record = tier.data[off : off + manifest.record_size]
    mem.dest(layer, 1)[:] = record.tobytes()  # as a tier does: straight into slot memory
    want = field_views(manifest, record)
    for name, view in mem.views[layer].items():
        as_np = (lambda a: np.array(a.view(mx.uint16))) if view.dtype == mx.bfloat16 else np.array
        assert np.array_equal(as_np(view[1]), want[name]), name
        assert not np.any(as_np(view[0])), "other slots stay untouched"
    assert mem.dest(layer, 0).nbytes == manifest.record_size


def test_widened_scales_are_the_records_values_in_the_compute_dtype(store: Path) -> None:
    """Scales/biases held as float32 (MLX's gather_qmm computes): an fp32 sidecar (one pool for
    every layer), bit-exact."""
    manifest = Manifest.load(store)
    layers = manifest.moe_layers
    mem = SlotMemory(
        manifest, layers, n_slots=3, dtypes={f.name: mx.float32 for f in manifest.fields}
    )
    assert mem.widened and all(mem.views[a] is mem.views[layers[0]] for a in layers)
    tier = MockTier(store)
    off = manifest.record_offset(layers[-1], 2)
    record = tier.data[off : off + manifest.record_size]
    mem.dest(layers[-1], 2)[:] = record.tobytes()
    mem.widen(2)
    want = field_views(manifest, record)
    for f in manifest.fields:
        view = mem.views[layers[0]][f.name]
        if f.name in mem.widened:
            assert view.dtype == mx.float32
            src = want[f.name]
            ref = (src.astype(np.uint32) << 16).view(np.float32) if src.dtype == np.uint16 else src
            assert np.array_equal(np.array(view[2]), ref.astype(np.float32)), f.name
            assert not np.any(np.array(view[1])), "other slots stay untouched"
        else:
            assert np.array_equal(np.array(view[2]), want[f.name]), f.name


class AddressTier(MockTier):
    """Remembers where each read landed."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.addresses: list[int] = []

    async def read_into(self, key: ExpertKey, dest: memoryview) -> ReadInfo:
        self.addresses.append(np.frombuffer(dest, dtype=np.uint8).ctypes.data)
        return await super().read_into(key, dest)


def test_reads_land_directly_in_slot_memory(store: Path) -> None:
    async def main() -> tuple[AddressTier, Any]:
        tier = AddressTier(store)
        async with Engine.open(store, mode="reactive", tiers=tier) as eng:
            _ = [t async for t in eng.tokens(PROMPT, max_tokens=3, stop=False)]
            mem = eng.setup.ctx.memory
            starts = {int(r.ctypes.data): r.nbytes for r in mem._rows.values()}
            return tier, starts

    tier, starts = asyncio.run(main())
    assert tier.addresses
    for addr in tier.addresses:
        assert any(s <= addr < s + n for s, n in starts.items()), "read went to a staging buffer"
        assert addr % 4096 == 0, "slot memory is 4 KiB aligned for O_DIRECT"


def test_ticket_queue_serves_in_compute_order() -> None:
    async def main() -> list[tuple[int, int]]:
        q = TicketQueue()
        items = [(4, 2, PREFETCH), (3, 5, DEMAND), (4, 0, PREFETCH), (3, 1, DEMAND)]
        for step, order, kind in items:
            q.put(FetchTicket(1, step, order, 0, 0, kind, order))
        return [((t := await q.get()).step, t.order) for _ in range(4)]

    assert asyncio.run(main()) == [(3, 1), (3, 5), (4, 0), (4, 2)]


def test_tier_error_ends_the_request_and_the_next_one_works(store: Path) -> None:
    manifest = Manifest.load(store)

    async def main() -> tuple[list[int], list[int], str]:
        async with Engine.open(store, mode="resident") as ref_eng:
            ref = [t async for t in ref_eng.tokens(PROMPT, max_tokens=6, stop=False)]
        bad = {ExpertKey(layer, e) for layer in manifest.moe_layers for e in range(8)}
        tier = MockTier(store, fail=bad, faults=1)
        async with Engine.open(store, mode="hint", tiers=tier) as eng:
            with pytest.raises(TierReadError) as info:
                _ = [t async for t in eng.tokens(PROMPT, max_tokens=6, stop=False)]
            assert eng.last_stats is not None and eng.last_stats.finish_reason == "error"
            again = [t async for t in eng.tokens(PROMPT, max_tokens=6, stop=False)]
        return ref, again, str(info.value)

    ref, again, msg = asyncio.run(main())
    assert again == ref
    assert "layer" in msg and "expert" in msg and "injected fault" in msg


def test_event_loop_stays_responsive_and_trace_is_written(store: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"

    async def main() -> Any:
        tier = MockTier(store, delay=0.002)
        async with Engine.open(store, mode="route", tiers=tier, trace=trace) as eng:
            _ = [t async for t in eng.tokens(PROMPT, max_tokens=8, stop=False)]
            return eng.last_stats

    stats = asyncio.run(main())
    assert stats.loop_max_lag_ms < 100  # generous: the test machine is shared
    assert stats.tickets_issued > 0 and stats.tickets_consumed > 0
    data = json.loads(trace.read_text())
    events = data["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "compute" in names and any(n.startswith("tier worker") for n in names)
    spans = [e for e in events if e["ph"] == "X"]
    assert any(e["cat"].startswith("read.") for e in spans)
    assert any(e["cat"] == "compute.wait" for e in spans)
    assert all(e["dur"] >= 0 for e in spans)


def test_route_with_oracle_reads_nothing_on_demand_while_decoding(store: Path) -> None:
    async def main() -> tuple[Any, Any]:
        async with Engine.open(
            store, mode="reactive", tiers=MockTier(store), record_routing=True
        ) as eng:
            _ = [t async for t in eng.tokens(PROMPT, max_tokens=8, stop=False)]
            rec = eng.setup.ctx.recording
        async with Engine.open(
            store,
            mode="route",
            predictor="oracle",
            recording=rec,
            first_layer="wrap",
            tiers=MockTier(store),
        ) as eng:
            sched = eng.setup.scheduler
            _ = [t async for t in eng.tokens(PROMPT, max_tokens=8, stop=False)]
            n_layers = len(eng.setup.manifest.moe_layers)
            # 7 decode steps (the last prompt step yields the first token), every layer routed
            # by the prediction made one step earlier
            assert eng.setup.ctx.routed_by_prediction == 7 * n_layers
            return eng.last_stats, sched.stats

    stats, reads = asyncio.run(main())
    assert stats.tickets_wasted == 0 and stats.tickets_failed == 0
    # demand reads only happen while the prompt runs (first step has no prediction)
    assert reads.demand <= len(PROMPT) * 4 * 2
    # prompt steps before the last prefetch nothing; every read is used by compute
    assert reads.prefetch > 0 and reads.consumed == reads.issued
