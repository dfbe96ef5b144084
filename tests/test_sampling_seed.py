"""Seeded sampling: the same seed gives the same text in every mode, from the API and the CLI."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from runtime_helpers import PROMPT, MockTier

from edge0.cli.main import main
from edge0.errors import ConfigError
from edge0.layout.load import load_layout
from edge0.model.generate import SamplingSettings, generate
from edge0.options.engine import MODES
from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.summary import RunStats

HOT = SamplingSettings(max_tokens=12, temp=1.5, top_p=0.95, seed=7)


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]  # the session's read-only store (conftest.py)


async def engine_ids(
    store: Path, mode: str, settings: SamplingSettings, n: int = 2
) -> list[list[int]]:
    async with Engine.open(store, mode=mode, tiers=MockTier(store)) as eng:
        return [
            [t async for t in eng.tokens(PROMPT, max_tokens=12, sampling=settings, stop=False)]
            for _ in range(n)
        ]


def resident_ids(store: Path, settings: SamplingSettings) -> list[int]:
    loaded = load_layout(store)
    loaded.tokenizer._eos_token_ids = set()  # compare all 12 tokens
    return [p.token for p in generate(loaded, PROMPT, settings) if p.token is not None]


def test_same_seed_same_tokens_in_every_mode_and_the_resident_loop(store: Path) -> None:
    # route computes with the predicted experts (other tokens by design): reproducible only
    runs = {mode: asyncio.run(engine_ids(store, mode, HOT)) for mode in MODES}
    ref = runs["resident"][0]
    assert len(ref) == 12
    for mode, (first, second) in runs.items():
        assert second == first, f"{mode}: the seed is per request, not per engine"
        if mode != "route":
            assert first == ref, mode
    again = asyncio.run(engine_ids(store, "route", HOT, 1))
    assert again[0] == runs["route"][0]  # route with its own predictor: reproducible too
    other = SamplingSettings(max_tokens=12, temp=1.5, top_p=0.95, seed=8)
    assert asyncio.run(engine_ids(store, "hint", other, 1))[0] != ref  # the seed is used
    greedy = asyncio.run(engine_ids(store, "hint", SamplingSettings(max_tokens=12), 1))
    assert greedy[0] != ref  # temperature 1.5 on a random model samples away from argmax
    assert resident_ids(store, HOT) == ref  # edge0.model.generate (`run --mode resident`)


def test_engine_generate_takes_the_seed_from_the_sampling_settings(store: Path) -> None:
    async def text(mode: str) -> str:
        async with Engine.open(store, mode=mode, tiers=MockTier(store)) as eng:
            pieces = [p async for p in eng.generate("once upon", max_tokens=12, sampling=HOT)]
        assert isinstance(pieces[-1], RunStats)
        return "".join(p for p in pieces if isinstance(p, str))

    assert asyncio.run(text("hint")) == asyncio.run(text("resident"))


def test_cli_seed_gives_the_same_text_streaming_and_resident(store: Path) -> None:
    base = [
        "run",
        str(store),
        "-p",
        "once upon a time",
        "--no-chat",
        "--max-tokens",
        "12",
        "--temp",
        "1.5",
        "--seed",
        "7",
    ]
    modes = ([], ["--mode", "hint", "--tiers", "pread"], ["--mode", "resident"])
    outs = [CliRunner().invoke(main, base + extra) for extra in modes]
    route_again = CliRunner().invoke(main, base)
    assert route_again.stdout == outs[0].stdout  # the default (route) path honours --seed
    for res in outs:
        assert res.exit_code == 0, res.output
    assert outs[1].stdout == outs[2].stdout and outs[1].stdout.strip()


@pytest.mark.parametrize(
    "kw",
    [
        {"temp": math.nan},
        {"temp": math.inf},
        {"temp": -1.0},
        {"top_p": math.nan},
        {"top_p": 1.5},
        {"min_p": -0.1},
        {"top_k": -1},
        {"max_tokens": 0},
        {"seed": -1},
        {"seed": 2**64},
    ],
)
def test_invalid_sampling_settings_are_config_errors(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="sampling"):
        SamplingSettings(**kw)  # type: ignore[arg-type]
