"""edge0 convert --embed-bits/--attn-bits: 8-bit embeddings, LM head and attention, end to end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner
from layout_helpers import GROUP, greedy, mlx_lm_int4, tiny_hf
from runtime_helpers import PROMPT, MockTier

import edge0.model.loader
from edge0.cli import convert as convert_cmd
from edge0.errors import ConversionError
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.load import load_layout
from edge0.layout.manifest import Manifest
from edge0.layout.quant import resident_kind
from edge0.runtime.engine.api import Engine


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf(tmp_path_factory.mktemp("bits"), "qwen3_moe")


@pytest.fixture(scope="module")
def converted(hf: Path) -> dict[str, Path]:
    root = hf.parent
    out = {}
    for name, opts in {
        "4": ConvertOptions(group_size=GROUP),
        "e8": ConvertOptions(group_size=GROUP, embed_bits=8),
        "e8a8": ConvertOptions(group_size=GROUP, embed_bits=8, attn_bits=8),
    }.items():
        convert(hf, root / name, opts)
        out[name] = root / name
    return out


def _bits(path: Path) -> dict[str, int]:
    """Module path -> bits of every quantized resident module (experts left out)."""
    model = edge0.model.loader.load(path).model
    return {
        name: int(m.bits)
        for name, m in model.named_modules()
        if hasattr(m, "bits") and ".switch_mlp." not in name
    }


def test_resident_kinds() -> None:
    assert resident_kind("model.embed_tokens") == "embed"
    assert resident_kind("lm_head") == "embed"
    assert resident_kind("model.layers.3.self_attn.q_proj") == "attn"
    assert resident_kind("model.layers.3.linear_attn.out_proj") == "attn"
    assert resident_kind("model.layers.3.mlp.gate") is None
    assert resident_kind("model.layers.3.mlp.shared_expert.up_proj") is None


def test_only_the_chosen_kinds_change_bits(converted: dict[str, Path]) -> None:
    base, e8, e8a8 = (_bits(converted[n]) for n in ("4", "e8", "e8a8"))
    assert set(base) == set(e8) == set(e8a8)
    for module, b in base.items():
        kind = resident_kind(module)
        assert e8[module] == (8 if kind == "embed" else b), module
        assert e8a8[module] == (8 if kind in ("embed", "attn") else b), module
    assert base["model.embed_tokens"] == 4 and base["model.layers.0.mlp.gate"] == 8
    assert any(resident_kind(m) == "attn" for m in base)
    m = Manifest.load(converted["e8a8"])  # the manifest checks accept it; experts stay int4
    assert m.quantization["bits"] == 4
    assert m.config["quantization"]["model.embed_tokens"] == {"group_size": GROUP, "bits": 8}


def test_eight_bit_model_loads_and_is_closer_to_the_float_source(
    hf: Path, converted: dict[str, Path]
) -> None:
    x = mx.array(PROMPT)[None]
    ref = edge0.model.loader.load(hf).model(x).astype(mx.float32)
    err = {}
    for name, path in converted.items():
        model = load_layout(path, dtype=None).model
        embed = model.model.embed_tokens
        assert embed.bits == (4 if name == "4" else 8)
        err[name] = float(mx.mean(mx.abs(model(x).astype(mx.float32) - ref)))
    assert err["e8a8"] < err["e8"] < err["4"]


def test_streaming_engine_runs_the_eight_bit_layout(converted: dict[str, Path]) -> None:
    path = converted["e8a8"]

    async def decode(mode: str) -> list[int]:
        async with Engine.open(path, mode=mode, tiers=MockTier(path)) as eng:
            return [t async for t in eng.tokens(PROMPT, max_tokens=8, stop=False)]

    resident = asyncio.run(decode("resident"))
    assert asyncio.run(decode("reactive")) == resident
    assert greedy(load_layout(path, dtype=None).model, PROMPT, 8) == resident


def test_default_stays_mlx_lm_int4_and_bad_options_fail(
    hf: Path, converted: dict[str, Path], tmp_path: Path
) -> None:
    assert _bits(converted["4"]) == _bits(mlx_lm_int4(hf, tmp_path / "mlx"))
    with pytest.raises(ConversionError, match="--embed-bits 6 is not one of"):
        convert(hf, tmp_path / "bad", ConvertOptions(group_size=GROUP, embed_bits=6))
    with pytest.raises(ConversionError, match="without requantizing"):
        convert(tmp_path / "mlx", tmp_path / "re", ConvertOptions(embed_bits=8))
    r = CliRunner().invoke(
        convert_cmd.command,
        [str(hf), str(tmp_path / "cli"), "--group-size", str(GROUP), "--embed-bits", "8"],
    )
    assert r.exit_code == 0, r.output
    assert _bits(tmp_path / "cli") == _bits(converted["e8"])
