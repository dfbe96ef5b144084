"""`edge0 synth`: exact real-model shapes, valid layout, HF format feeds convert."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zlib
from collections import namedtuple
from pathlib import Path

import mlx.core as mx
import pytest

from edge0.errors import ConversionError
from edge0.layout.atomic import FREE_MARGIN, FREE_SLACK
from edge0.layout.convert import convert
from edge0.layout.load import load_layout
from edge0.layout.manifest import EXPERTS_FILE, RESIDENT_FILE, Manifest
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
    args = ["synth", "--shape", "tiny", str(tmp_path / "s")]
    result = subprocess.run([sys.executable, "-m", "edge0", *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "32 records" in result.stdout
    assert verify(tmp_path / "s", progress=False).records == 32


def test_free_disk_check(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9, 1000))
    with pytest.raises(ConversionError, match="GB free"):
        synth.synthesize("tiny", tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_zero_experts_are_holes_that_verify_and_run(tmp_path: Path) -> None:
    """--zero-experts: a full-size experts.bin of zero records that takes (almost) no disk."""
    real = synthesize("tiny", tmp_path / "real", seed=1)
    m = synthesize("tiny", tmp_path / "zero", seed=1, zero_experts=True)
    assert verify(tmp_path / "zero", progress=False).records == m.n_records
    same = (real.fields, real.record_size, real.moe_layers)
    assert (m.fields, m.record_size, m.moe_layers) == same
    assert set(m.crc32) == {zlib.crc32(bytes(m.record_size))}
    experts = (tmp_path / "zero" / EXPERTS_FILE).stat()
    assert experts.st_size == (tmp_path / "real" / EXPERTS_FILE).stat().st_size
    assert experts.st_size == m.n_records * m.record_size
    assert experts.st_blocks * 512 < experts.st_size // 4  # holes, not written zeros
    for name in (RESIDENT_FILE, "config.json"):  # the resident part is the random one
        assert (tmp_path / "zero" / name).read_bytes() == (tmp_path / "real" / name).read_bytes()
    logits = load_layout(tmp_path / "zero").model(mx.array([[1, 2, 3, 4, 5]]))
    assert bool(mx.all(mx.isfinite(logits)))


def test_zero_experts_need_only_the_resident_file_free(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    synthesize("tiny", tmp_path / "real")
    resident = (tmp_path / "real" / RESIDENT_FILE).stat().st_size
    experts = (tmp_path / "real" / EXPERTS_FILE).stat().st_size
    # room for the resident file and its margin, not for the experts too
    free = int((resident + experts // 2) * (1 + FREE_MARGIN)) + FREE_SLACK
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**12, 10**12 - free, free))
    synthesize("tiny", tmp_path / "zero", zero_experts=True)
    with pytest.raises(ConversionError, match="GB free"):
        synthesize("tiny", tmp_path / "full")


def test_zero_experts_tool_flag(tmp_path: Path) -> None:
    args = ["synth", "--shape", "tiny", "--zero-experts", str(tmp_path / "s")]
    runs = [  # side by side: separate outputs
        subprocess.Popen(
            [sys.executable, "-m", "edge0", *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cmd in (args, [*args[:4], "--compress", "zstd", str(tmp_path / "z")])
    ]
    (out, err), (_, bad_err) = (proc.communicate(timeout=300) for proc in runs)
    assert runs[0].returncode == 0, err
    assert "the experts are holes" in out
    assert runs[1].returncode == 2 and "--zero-experts" in bad_err
