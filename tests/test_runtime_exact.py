"""Exactness: reactive and hint decode resident's greedy tokens; so does route with the oracle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_helpers import PROMPT, MockTier, build_store

from edge0.runtime.engine.api import Engine
from edge0.runtime.io.tickets import DEMAND

FAMILIES = ["qwen3_moe", "qwen3_5_moe"]


@pytest.fixture(scope="module")
def store_root(runtime_store_root: Path) -> Path:
    return runtime_store_root


@pytest.fixture(scope="module")
def stores(runtime_stores: dict[str, Path]) -> dict[str, Path]:
    return {mt: runtime_stores[mt] for mt in FAMILIES}


async def decode(path: Path, prompt: list[int], n: int = 12, **opts: Any) -> tuple[list[int], Any]:
    opts.setdefault("tiers", MockTier(path))
    async with Engine.open(path, **opts) as eng:
        toks = [t async for t in eng.tokens(prompt, max_tokens=n, stop=False)]
        return toks, eng


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("first", ["resident", "wrap", "reactive"])
def test_modes_match_resident(
    stores: dict[str, Path], family: str, first: str, tmp_path: Path
) -> None:
    path = stores[family]
    ref, _ = run(decode(path, PROMPT, mode="resident"))
    got, eng = run(decode(path, PROMPT, mode="reactive", record_routing=True, first_layer=first))
    assert got == ref
    recording = eng.setup.ctx.recording
    hint, _ = run(decode(path, PROMPT, mode="hint", predictor="init", first_layer=first))
    assert hint == ref
    oracle, eng = run(
        decode(
            path,
            PROMPT,
            mode="route",
            predictor="oracle",
            recording=recording,
            first_layer=first,
            trace=tmp_path / "t.json",
        )
    )
    assert oracle == ref
    n_layers = len(eng.setup.manifest.moe_layers)
    predicted_layers = n_layers if first == "wrap" else n_layers - 1
    assert eng.setup.ctx.routed_by_prediction == (12 - 1) * predicted_layers
    # the oracle predicts every decode step: after the prompt nothing is read on demand
    # (but the first layer under --first-layer reactive, which nothing predicts)
    decode_steps = {r.step for r in eng.setup.ctx.records if not r.prefill}
    reads = [e["args"] for e in eng.setup.tracer.events if e.get("cat", "").startswith("read.")]
    on_demand = {r["layer"] for r in reads if r["kind"] == DEMAND and r["step"] in decode_steps}
    assert len(decode_steps) == 12 - 1 and reads
    assert on_demand == ({eng.setup.manifest.moe_layers[0]} if first == "reactive" else set())
    assert eng.last_stats.tickets_wasted == 0


@pytest.mark.parametrize("k", [1, 3])
def test_capacity_k_reactive_matches_resident_at_k(stores: dict[str, Path], k: int) -> None:
    path = stores["qwen3_moe"]
    ref, _ = run(decode(path, PROMPT, mode="resident", top_k=k))
    got, eng = run(decode(path, PROMPT, mode="reactive", top_k=k, record_routing=True))
    assert got == ref
    oracle, _ = run(
        decode(
            path,
            PROMPT,
            mode="route",
            top_k=k,
            predictor="oracle",
            recording=eng.setup.ctx.recording,
        )
    )
    assert oracle == ref


def test_route_with_a_wrong_predictor_differs_but_reads_only_its_set(
    stores: dict[str, Path],
) -> None:
    path = stores["qwen3_moe"]
    ref, _ = run(decode(path, PROMPT, mode="resident"))
    got, eng = run(decode(path, PROMPT, mode="route", predictor="temporal", first_layer="reactive"))
    assert len(got) == len(ref)
    assert eng.last_stats.tickets_issued > 0


def test_pread_tier_matches_resident(stores: dict[str, Path]) -> None:
    path = stores["qwen3_5_moe"]
    ref, _ = run(decode(path, PROMPT, mode="resident"))
    got, _ = run(decode(path, PROMPT, mode="hint", tiers="ram:64KiB>pread"))
    assert got == ref


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(FAMILIES),
    seed=st.integers(1, 3),
    experts=st.sampled_from([4, 8]),
    prompt=st.lists(st.integers(3, 300), min_size=1, max_size=6),
    k=st.integers(1, 3),
    mode=st.sampled_from(["reactive", "hint"]),
)
def test_property_streamed_equals_resident(
    store_root: Path, family: str, seed: int, experts: int, prompt: list[int], k: int, mode: str
) -> None:
    """Random small stores (seed, expert count), prompts, capacities and modes."""
    path = build_store(store_root, family, seed=seed, experts=experts)
    ref, _ = run(decode(path, prompt, n=6, mode="resident", top_k=k))
    got, _ = run(decode(path, prompt, n=6, mode=mode, top_k=k, predictor="init"))
    assert got == ref
