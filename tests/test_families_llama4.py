"""Llama-4 edges: the q/k norm eps correction, configs Edge0 refuses, top-1 only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from runtime_helpers import PROMPT, MockTier
from test_reference import edge0_logits

from edge0.errors import ModelLoadError
from edge0.layout.convert import ConvertOptions, convert
from edge0.model.loader import load
from edge0.runtime.engine.api import Engine
from edge0.synth.tiny_families import fixture_file, write_family

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_family(fixture_file(FIXTURES, "llama4"), tmp_path_factory.mktemp("llama4") / "hf")


def _delta(path: Path) -> float:
    g = dict(np.load(FIXTURES / "golden" / "llama4.npz"))
    ours = edge0_logits(load(path), g["prompt_ids"], g["decode_ids"])
    return max(float(np.abs(ours[k] - g[k]).max()) for k in ("prefill_logits", "decode_logits"))


def test_qk_norm_uses_the_config_eps(hf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mlx-lm's fixed 1e-6 is 7.9e-5 off transformers on the fixture; the config's 1e-5 is not."""
    from edge0.families.llama4 import Llama4

    assert _delta(hf) < 2e-5
    monkeypatch.setattr(Llama4, "adapt", lambda self, model, tc: None)
    assert _delta(hf) > 5e-5


def _edited(hf: Path, dst: Path, **text: Any) -> Path:
    dst.mkdir()
    for f in hf.iterdir():
        (dst / f.name).symlink_to(f)
    (dst / "config.json").unlink()
    config = json.loads((hf / "config.json").read_text())
    config["text_config"].update(text)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ({"moe_layers": [0, 1.5]}, "refuses it .*Field 'moe_layers' with value \\[0, 1.5\\]"),
        ({"no_rope_layers": [1, 0, 1]}, r"no_rope_layers=\[1, 0, 1\] is invalid"),
        (
            {"attention_chunk_size": None, "layer_types": ["chunked_attention"] * 4},
            "chunked only with an attention_chunk_size",
        ),
    ],
)
def test_configs_transformers_cannot_run_are_refused(
    hf: Path, tmp_path: Path, text: dict[str, Any], message: str
) -> None:
    path = _edited(hf, tmp_path / "edited", **text)
    with pytest.raises(ModelLoadError, match=message) as err:
        load(path)
    assert "\n" not in str(err.value) and str(path / "config.json") in str(err.value)


def test_top_two_runs_each_expert_on_its_own_gated_input(tmp_path: Path) -> None:
    """The top-2 variant (transformers' golden logits: tests/test_config_fidelity.py): one
    token at a time and in prompt chunks of 3, resident and reactive give one mlx-lm pass's
    tokens; `--top-k 1` lowers it; routed training's logits are the model's."""
    from layout_helpers import greedy

    from edge0.layout.load import load_layout
    from edge0.train.routed import plan_logits, replay_logits, routed

    hf = write_family(fixture_file(FIXTURES, "llama4-top2"), tmp_path / "hf")
    e0 = tmp_path / "e0"
    convert(hf, e0, ConvertOptions(group_size=32))
    model = load_layout(e0).model
    prompt = [5 + (7 * i) % 250 for i in range(30)]
    want = greedy(model, prompt, 10)

    async def run(mode: str, **opts: Any) -> list[int]:
        async with Engine.open(e0, tiers=MockTier(e0), mode=mode, **opts) as eng:
            return [t async for t in eng.tokens(prompt, max_tokens=10, stop=False)]

    for mode in ("resident", "reactive"):
        for chunk in (1, 3):
            assert asyncio.run(run(mode, prefill_chunk=chunk)) == want, (mode, chunk)
    assert asyncio.run(run("reactive", top_k=1)) != want  # a top-1 model decodes otherwise
    tokens = mx.array([prompt[:12]])
    ref = model(tokens)
    with routed(model, None, k=2) as state:
        planned, plan = plan_logits(model, state, tokens, prefill=12)
        replayed = replay_logits(model, state, tokens, plan)
    for got in (planned, replayed):
        assert float(mx.abs(got - ref).max()) < 1e-4


def test_chunked_prefill_and_decode_equal_one_plain_run(hf: Path, tmp_path: Path) -> None:
    """Prompt chunks of 3 against attention chunks of 4 (ChunkedKVCache trimmed between the
    engine's calls): resident and reactive tokens equal one mlx-lm pass over the prompt."""
    from layout_helpers import greedy

    from edge0.layout.load import load_layout

    e0 = tmp_path / "e0"
    convert(hf, e0, ConvertOptions(group_size=32))
    prompt = [5 + (7 * i) % 250 for i in range(30)]
    want = greedy(load_layout(e0).model, prompt, 10)

    async def run(mode: str) -> list[int]:
        async with Engine.open(e0, tiers=MockTier(e0), mode=mode, prefill_chunk=3) as eng:
            return [t async for t in eng.tokens(prompt, max_tokens=10, stop=False)]

    assert asyncio.run(run("resident")) == want
    assert asyncio.run(run("reactive")) == want


@pytest.mark.parametrize("name", ["llama4", "llama4-top2"])
def test_the_in_graph_route_choice_gates_each_experts_input(tmp_path: Path, name: str) -> None:
    """Route mode, available-first chosen in the graph, every expert staged: the choice is
    the true top-k, and each expert runs on its gated input as in resident mode."""
    from test_route_policy_graph import N, _decode_staged

    hf = write_family(fixture_file(FIXTURES, name), tmp_path / "hf")
    e0 = tmp_path / "e0"
    convert(hf, e0, ConvertOptions(group_size=32))

    async def resident() -> list[int]:
        async with Engine.open(e0, tiers=MockTier(e0), mode="resident") as eng:
            return [t async for t in eng.tokens(PROMPT, max_tokens=N, stop=False)]

    ref = asyncio.run(resident())
    got, eng = asyncio.run(
        _decode_staged(e0, mode="route", predictor="init", route_policy="available-first")
    )
    assert eng.setup.ctx.policy.on_device
    assert eng.last_stats.route_recall == 1.0
    assert got == ref
