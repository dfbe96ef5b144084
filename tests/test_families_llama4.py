"""Llama-4 edges: the q/k norm eps correction, configs Edge0 refuses, top-1 only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runtime_helpers import PROMPT, MockTier
from test_reference import edge0_logits

from edge0.errors import ConfigError, ModelLoadError
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
        ({"num_experts_per_tok": 2}, "num_experts_per_tok=2: transformers runs each of a token"),
        ({"moe_layers": [0, 4]}, r"moe_layers=\[0, 4\] is invalid: llama4's moe_layers must be"),
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


def test_top_k_other_than_one_is_refused(hf: Path, tmp_path: Path) -> None:
    e0 = tmp_path / "e0"
    convert(hf, e0, ConvertOptions(group_size=32))

    async def run(mode: str) -> None:
        async with Engine.open(e0, tiers=MockTier(e0), mode=mode, top_k=2) as eng:
            [t async for t in eng.tokens(PROMPT, max_tokens=2, stop=False)]

    for mode in ("resident", "reactive"):
        with pytest.raises(ConfigError, match="--top-k 2: llama4 routes one expert per token"):
            asyncio.run(run(mode))


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
