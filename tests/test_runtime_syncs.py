"""Route mode's host syncs (--sync-every G) and its reads: same tokens, fewer syncs, no waste."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PROMPT, MockTier, build_store

from edge0.errors import ConfigError
from edge0.runtime.engine.api import Engine
from edge0.storage.tier import ExpertKey

N = 10  # decode tokens


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # qwen3_5_moe, 8 MoE layers: groups of 2, 4 and 8 all differ
    return build_store(tmp_path_factory.mktemp("syncs"), "qwen3_5_moe", layers=8)


async def _decode(path: Path, **opts: Any) -> tuple[list[int], Any]:
    async with Engine.open(path, tiers=MockTier(path), **opts) as eng:
        toks = [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]
        return toks, eng


@pytest.mark.parametrize(("first", "groups"), [("resident", (1, 2, 4, 8)), ("wrap", (1, 8))])
def test_grouped_syncs_decode_the_same_tokens_with_fewer_syncs(
    store: Path, first: str, groups: tuple[int, ...]
) -> None:
    runs = {
        g: asyncio.run(
            _decode(store, mode="route", predictor="init", first_layer=first, sync_every=g)
        )
        for g in groups
    }
    ref, eng = runs[1]
    n_layers = len(eng.setup.manifest.moe_layers)
    # G=1 is the per-layer path: one readback per MoE layer, then the step fence
    assert eng.last_stats.syncs_per_token == n_layers + 1
    for g, (toks, eng) in runs.items():
        assert toks == ref, f"sync_every={g} changed the route tokens"
        stats = eng.last_stats
        # a group completes when the next one launches; the last one joins the fence
        assert stats.syncs_per_token == (n_layers + 1 if g == 1 else -(-n_layers // g)), g
        assert stats.tickets_wasted == 0 and stats.tickets_cancelled == 0, g
        assert eng.setup.ctx.routed_by_prediction == (N - 1) * (n_layers - (first == "resident"))


def test_grouped_route_with_the_oracle_equals_resident(store: Path) -> None:
    ref, _ = asyncio.run(_decode(store, mode="resident"))
    got, eng = asyncio.run(_decode(store, mode="reactive", record_routing=True))
    assert got == ref
    oracle, eng = asyncio.run(
        _decode(
            store, mode="route", predictor="oracle", sync_every=4, recording=eng.setup.ctx.recording
        )
    )
    assert oracle == ref
    assert eng.last_stats.syncs_per_token == 2  # 8 layers in groups of 4


def test_temporal_predictor_reads_the_true_routing_in_groups(store: Path) -> None:
    """A host predictor needs the true set: it is read back with the group, same tokens."""
    one, _ = asyncio.run(_decode(store, mode="route", predictor="temporal", sync_every=1))
    four, eng = asyncio.run(_decode(store, mode="route", predictor="temporal", sync_every=4))
    assert four == one
    assert eng.last_stats.tickets_wasted == 0


@pytest.mark.parametrize("chunk", [1, 4])
def test_prompt_steps_before_the_last_prefetch_nothing(store: Path, chunk: int) -> None:
    async def main() -> tuple[MockTier, Any]:
        tier = MockTier(store)
        async with Engine.open(
            store, mode="hint", predictor="init", tiers=tier, prefill_chunk=chunk
        ) as eng:
            _ = [t async for t in eng.tokens(PROMPT, max_tokens=1, stop=False)]
            return tier, eng.setup.scheduler.stats

    _, reads = asyncio.run(main())
    # max_tokens=1: the last prompt step yields the only token: no step prefetches for decode
    if chunk == 1:
        assert reads.prefetch == 0 and reads.demand == reads.issued > 0
    else:  # a chunk prefetches a layer's next group only, for its next sub-step: all consumed
        assert reads.issued > 0 and reads.consumed == reads.issued and reads.cancelled == 0


def test_end_request_cancels_queued_prefetches(store: Path) -> None:
    async def main() -> tuple[MockTier, int, Any]:
        tier = MockTier(store)
        async with Engine.open(
            store, mode="hint", predictor="init", tiers=tier, io_workers=1
        ) as eng:
            _ = [t async for t in eng.tokens(PROMPT, max_tokens=2, stop=False)]
            await eng.wait_idle()  # the request's own end_request runs after its last token
            tier.delay = 0.05  # slow reads from here on (the request's own needed none)
            sched = eng.setup.scheduler
            reads_before = len(tier.reads)
            layer = eng.setup.manifest.moe_layers[-1]
            absent = [e for e in range(8) if e not in sched.table.layers[layer]][:2]
            assert sched.prefetch(layer, sched.now + 1, absent) == 2
            cancelled = sched.end_request()
            await asyncio.sleep(0.2)
            return tier, cancelled, (reads_before, sched.stats)

    tier, cancelled, (before, stats) = asyncio.run(main())
    assert cancelled == 2 and stats.cancelled >= 2
    assert len(tier.reads) == before, "a cancelled prefetch was read"
    assert all(isinstance(k, ExpertKey) for k in tier.reads)


def test_sync_every_must_be_positive(store: Path) -> None:
    with pytest.raises(ConfigError, match=r"--sync-every \(sync_every=\) must be at least 1"):
        asyncio.run(_decode(store, mode="route", sync_every=0))
