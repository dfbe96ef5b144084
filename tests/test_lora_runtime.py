"""The route-mode simulation used by training and eval decodes what the streaming Engine decodes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from runtime_helpers import PROMPT, MockTier, build_store

import edge0.model.loader
from edge0.routing.prerouter import PrerouterSet
from edge0.runtime.engine.api import Engine
from edge0.train import routed

N = 10


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-rt")
    return {mt: build_store(root, mt) for mt in ("qwen3_moe", "qwen3_5_moe")}


def engine_tokens(store: Path, **opts: Any) -> list[int]:
    async def go() -> list[int]:
        async with Engine.open(store, tiers=MockTier(store), **opts) as eng:
            return [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]

    return asyncio.run(go())


def simulated_tokens(store: Path, k: int, heads: str | None, wrap: bool = True) -> list[int]:
    model = edge0.model.loader.load(store).model
    prerouter = PrerouterSet.from_model(model) if heads == "init" else None
    with routed.routed(model, prerouter, k, wrap=wrap) as state:
        seq, _ = routed.generate(model, state, mx.array([PROMPT]), N, temperature=0.0)
    out: list[int] = seq[0, len(PROMPT) :].tolist()  # type: ignore[assignment]
    return out


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"])
@pytest.mark.parametrize("k", [1, 2])
def test_true_routing_at_capacity_k_matches_the_engine(stores, family, k):
    assert simulated_tokens(stores[family], k, None) == engine_tokens(
        stores[family], mode="resident", top_k=k
    )


@pytest.mark.parametrize("first_layer", ["wrap", "reactive"])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"])
def test_route_mode_with_init_heads_matches_the_engine(stores, family, k, first_layer):
    # Training and eval see exactly the routing `edge0 run --mode route` executes:
    # the first MoE layer routed by the wrap-around head, or by its own true top-K.
    wrap = first_layer == "wrap"
    assert simulated_tokens(stores[family], k, "init", wrap) == engine_tokens(
        stores[family], mode="route", predictor="init", top_k=k, first_layer=first_layer
    )


def test_engine_with_adapters_decodes_what_training_sees(tmp_path: Path):
    """The streaming Engine applies MODEL/adapters/ by default and, in route mode, decodes
    the simulation's tokens; adapter=False decodes the plain model."""
    from edge0.model import lora

    store = build_store(tmp_path, "qwen3_moe", seed=1)
    model = edge0.model.loader.load(store).model
    lora.apply_lora(model, lora.LoraConfig(rank=4, alpha=8))
    mx.random.seed(5)
    for _, m in lora.lora_modules(model):
        m.lora_b = 0.3 * mx.random.normal(m.lora_b.shape)
    lora.save_adapters(model, store / lora.ADAPTER_DIR, lora.LoraConfig(rank=4, alpha=8))
    with routed.routed(model, PrerouterSet.from_model(model), 1, wrap=True) as state:
        seq, _ = routed.generate(model, state, mx.array([PROMPT]), N, temperature=0.0)
    want = seq[0, len(PROMPT) :].tolist()

    opts = {"mode": "route", "predictor": "init", "top_k": 1, "first_layer": "wrap"}
    assert engine_tokens(store, **opts) == want
    assert engine_tokens(store, adapter=False, **opts) != want  # the adapter matters


def test_run_applies_adapters_unless_disabled(tmp_path: Path):
    from click.testing import CliRunner

    from edge0.cli.main import main
    from edge0.model import lora

    store = build_store(tmp_path, "qwen3_moe", seed=2)
    model = edge0.model.loader.load(store).model
    cfg = lora.LoraConfig(rank=4, alpha=8)
    lora.apply_lora(model, cfg)
    mx.random.seed(5)
    for _, m in lora.lora_modules(model):
        m.lora_b = 0.3 * mx.random.normal(m.lora_b.shape)
    lora.save_adapters(model, store / lora.ADAPTER_DIR, cfg)
    # `edge0 run`: adapters on by default, --no-adapter turns them off (resident path too).
    runner = CliRunner()
    base = ["run", str(store), "-p", "x", "--max-tokens", "6", "--no-chat"]
    outs = {}
    for mode in ("route", "resident"):
        for flag in ([], ["--no-adapter"]):
            top_k = ["--top-k", "1"] if mode == "route" else []  # a streaming-only flag
            r = runner.invoke(main, [*base, "--mode", mode, *top_k, *flag])
            assert r.exit_code == 0, r.output
            outs[mode, bool(flag)] = r.stdout
    assert outs["route", False] != outs["route", True]
    assert outs["resident", False] != outs["resident", True]
