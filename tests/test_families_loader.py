"""Family loader edges: per-expert Qwen3.5 tensors (transformers 5), unsupported and dense."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner
from runtime_helpers import PROMPT

from edge0.cli.main import main as cli
from edge0.errors import CheckpointError, ModelLoadError
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.load import load_layout
from edge0.model.loader import load

FIXTURES = Path(__file__).parent / "fixtures"
FUSED = re.compile(r"^(?P<pre>.*\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


def _per_expert_copy(dst: Path) -> Path:
    """The Qwen3.5 fixture re-saved as transformers 5 does: one tensor per expert projection."""
    shutil.copytree(FIXTURES / "qwen3_5_moe", dst)
    weights = mx.load(str(dst / "model.safetensors"))
    out = {}
    for key, value in weights.items():
        m = FUSED.match(key)
        if m is None:
            out[key] = value
            continue
        for e in range(value.shape[0]):
            if m["kind"] == "down_proj":
                out[f"{m['pre']}.{e}.down_proj.weight"] = value[e]
            else:
                half = value.shape[1] // 2
                out[f"{m['pre']}.{e}.gate_proj.weight"] = value[e, :half]
                out[f"{m['pre']}.{e}.up_proj.weight"] = value[e, half:]
    mx.save_safetensors(str(dst / "model.safetensors"), out, metadata={"format": "pt"})
    return dst


def _logits(model: object) -> np.ndarray:
    out = model(mx.array(PROMPT)[None])  # type: ignore[operator]
    mx.eval(out)
    return np.array(out)


def test_per_expert_qwen3_5_loads_resident_and_converts(tmp_path: Path) -> None:
    per = _per_expert_copy(tmp_path / "per-expert")
    assert not any("gate_up_proj" in k for k in mx.load(str(per / "model.safetensors")))
    want = _logits(load(FIXTURES / "qwen3_5_moe").model)
    assert np.array_equal(_logits(load(per).model), want)
    a = convert(FIXTURES / "qwen3_5_moe", tmp_path / "a", ConvertOptions(group_size=32))
    b = convert(per, tmp_path / "b", ConvertOptions(group_size=32))
    assert a.crc32 == b.crc32  # the same expert records byte for byte
    assert np.array_equal(
        _logits(load_layout(tmp_path / "a").model), _logits(load_layout(tmp_path / "b").model)
    )


def test_missing_expert_is_named(tmp_path: Path) -> None:
    per = _per_expert_copy(tmp_path / "per-expert")
    weights = dict(mx.load(str(per / "model.safetensors")))
    del weights["model.language_model.layers.1.mlp.experts.3.up_proj.weight"]
    mx.save_safetensors(str(per / "model.safetensors"), weights, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp\.experts: per-expert tensors are"):
        load(per)


def _edit(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"model_type": "phimoe", "num_local_experts": 8},
            "model_type 'phimoe' is a Mixture-of-Experts family Edge0 does not support yet; "
            "supported: deepseek_v2, deepseek_v3, glm4_moe, gpt_oss, granitemoe, kimi_k2, "
            "llama4, mixtral, olmoe, qwen2_moe, qwen3_5_moe, qwen3_moe, qwen3_next",
        ),
        ({"model_type": "llama"}, "model_type 'llama' is a dense model: it has no experts"),
        ({"num_experts": 0}, "'qwen3_moe' without routed experts is a dense model: it has no"),
    ],
)
def test_convert_names_the_family_in_one_line(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "qwen3_moe", src)
    _edit(src, **changes)
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "out")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edge0: error: ")
    assert message in lines[0]
    assert not (tmp_path / "out").exists()


def test_values_mlx_lms_classes_lacked_are_read_and_what_transformers_lacks_refused() -> None:
    """Values mlx-lm's classes computed differently, refused before, pass the config check now
    (their logits against transformers: tests/test_config_probes.py and the variants'
    goldens); an activation transformers' ACT2FN lacks is refused, saying so."""
    from edge0.model.arch import normalize_config

    for config in (
        {"model_type": "qwen2_moe", "norm_topk_prob": True},
        {"model_type": "qwen2_moe", "mlp_only_layers": [0]},
        {"model_type": "gpt_oss", "swiglu_limit": 10.0},
        {"model_type": "qwen3_next", "hidden_act": "gelu"},  # its causal conv computes it too
        {"model_type": "qwen3_next", "hidden_act": "xielu"},  # weights of its own
        {"model_type": "qwen2_moe", "hidden_act": "prelu"},
    ):
        normalize_config(config)
    with pytest.raises(ModelLoadError, match='hidden_act="swiglu".*one of transformers\' ACT2FN'):
        normalize_config({"model_type": "qwen3_next", "hidden_act": "swiglu"})


def _mixed_bits_dir(tmp_path: Path) -> Path:
    """An mlx dir whose experts' down_proj has 8 bits (mlx-lm's granitemoe recipe, on qwen3_moe)."""
    from layout_helpers import mlx_lm_int4

    mlx_dir = mlx_lm_int4(FIXTURES / "qwen3_moe", tmp_path / "mlx")
    file = next(mlx_dir.glob("*.safetensors"))
    weights = dict(mx.load(str(file)))
    for key in [k for k in weights if k.endswith("switch_mlp.down_proj.weight")]:
        pre = key.rpartition(".")[0]
        w = mx.dequantize(weights[key], weights[f"{pre}.scales"], weights[f"{pre}.biases"], 32, 4)
        weights[key], weights[f"{pre}.scales"], weights[f"{pre}.biases"] = mx.quantize(w, 32, 8)
    mx.save_safetensors(str(file), weights, metadata={"format": "mlx"})
    return mlx_dir


def test_mlx_dir_with_per_projection_bits_converts_byte_exact_and_streams(tmp_path: Path) -> None:
    from layout_helpers import greedy
    from test_families import every_mode_matches_resident

    from edge0.layout.manifest import Manifest
    from edge0.layout.records import field_views
    from edge0.layout.verify import verify

    mlx_dir = _mixed_bits_dir(tmp_path)
    m = convert(mlx_dir, tmp_path / "e0")
    assert m.quantization["projections"] == {"down_proj": {"bits": 8, "group_size": 32}}
    assert m.field("down_proj.weight").shape[1] * 32 // 8 == m.field("gate_proj.weight").shape[0]
    src = mx.load(str(next(mlx_dir.glob("*.safetensors"))))
    raw = (tmp_path / "e0" / "experts.bin").read_bytes()
    layer, expert = m.moe_layers[-1], 3
    at = (m.moe_layers.index(layer) * m.n_experts + expert) * m.record_size
    views = field_views(m, bytearray(raw[at : at + m.record_size]))
    for name, view in views.items():  # the source's bytes, field for field
        stacked = src[f"model.layers.{layer}.mlp.switch_mlp.{name}"][expert]
        if stacked.dtype == mx.bfloat16:
            stacked = stacked.view(mx.uint16)
        assert view.tobytes() == np.array(stacked).tobytes(), name
    assert verify(tmp_path / "e0", progress=False).records == m.n_records
    assert greedy(load_layout(tmp_path / "e0").model, PROMPT, 10) == greedy(
        load(mlx_dir).model, PROMPT, 10
    )
    every_mode_matches_resident(tmp_path / "e0")
    # a manifest naming a bad per-projection bits is refused in one line
    doc = json.loads((tmp_path / "e0" / "edge0.json").read_text())
    doc["quantization"]["projections"]["down_proj"]["bits"] = 7
    (tmp_path / "e0" / "edge0.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"projections.down_proj bits 7 is not") as e:
        Manifest.load(tmp_path / "e0")
    assert "\n" not in str(e.value)
