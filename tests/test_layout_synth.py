"""tools/synth_checkpoint.py: exact real-model shapes, valid layout, HF format feeds convert."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import mlx.core as mx
import pytest

from edge0.errors import ConversionError
from edge0.layout.convert import convert
from edge0.layout.load import load_layout
from edge0.layout.manifest import Manifest
from edge0.layout.model import build_float_model
from edge0.layout.quant import switch_modules
from edge0.layout.records import record_layout
from edge0.layout.verify import verify
from edge0.synth import layout as synth
from edge0.synth.hf import write_hf
from edge0.synth.layout import shape_config, synthesize


@pytest.mark.parametrize(
    ("shape", "layers", "experts", "d", "ff", "top_k"),
    [
        ("qwen3.5-35b-a3b", 40, 256, 2048, 512, 8),
        ("qwen3-30b-a3b", 48, 128, 2048, 768, 8),
    ],
)
def test_real_shapes_come_from_transformers(shape, layers, experts, d, ff, top_k) -> None:  # type: ignore[no-untyped-def]
    model = build_float_model(shape_config(shape))  # lazy: nothing is materialized
    switch = switch_modules(model)
    assert list(switch) == list(range(layers))
    n, f, width = switch[0][1].gate_proj.weight.shape
    assert (n, f, width) == (experts, ff, d)
    cfg = shape_config(shape)
    assert (cfg.get("text_config") or cfg)["num_experts_per_tok"] == top_k


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen3"])
def test_synth_edge0_layout_verifies_and_runs(shape: str, tmp_path: Path) -> None:
    m = synthesize(shape, tmp_path / "s")
    assert verify(tmp_path / "s", progress=False).records == m.n_records
    cfg = shape_config(shape)
    d = (cfg.get("text_config") or cfg)["hidden_size"]
    ff = (cfg.get("text_config") or cfg)["moe_intermediate_size"]
    assert m.record_size == record_layout(d, ff, 4, 64, "bfloat16").record_size
    back = Manifest.load(tmp_path / "s")
    assert (back.fields, back.crc32, back.moe_layers) == (m.fields, m.crc32, m.moe_layers)
    lm = load_layout(tmp_path / "s")
    logits = lm.model(mx.array([[1, 2, 3, 4, 5]]))
    assert bool(mx.all(mx.isfinite(logits)))
    assert float(logits.std()) > 0.1  # random but not degenerate


def test_synth_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = synthesize("tiny", tmp_path / "a", seed=3)
    b = synthesize("tiny", tmp_path / "b", seed=3)
    c = synthesize("tiny", tmp_path / "c", seed=4)
    assert a.crc32 == b.crc32 and a.crc32 != c.crc32
    assert len(set(a.crc32)) == len(a.crc32)  # every record is different


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen3"])
def test_hf_format_converts(shape: str, tmp_path: Path) -> None:
    write_hf(shape, tmp_path / "hf", shards=2)
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    with pytest.raises(ConversionError, match="--force"):
        write_hf(shape, tmp_path / "hf")
    m = convert(tmp_path / "hf", tmp_path / "e0")
    lm = load_layout(tmp_path / "e0")
    assert bool(mx.all(mx.isfinite(lm.model(mx.array([[1, 2, 3]])))))
    assert m.n_records == len(m.moe_layers) * m.n_experts


def test_tool_command_line(tmp_path: Path) -> None:
    tool = Path(__file__).resolve().parents[1] / "tools" / "synth_checkpoint.py"
    args = ["--shape", "tiny", str(tmp_path / "s")]
    result = subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "32 records" in result.stdout
    assert verify(tmp_path / "s", progress=False).records == 32


def test_free_disk_check(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9, 1000))
    with pytest.raises(ConversionError, match="GB free"):
        synth.synthesize("tiny", tmp_path / "s")
    assert not (tmp_path / "s").exists()
