"""edge0.load: HF (single/sharded) and mlx-lm quantized directories, config variants, bad input."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import edge0
from edge0.errors import ModelLoadError
from edge0.model.loader import activation_dtype, build_model, load
from edge0.synth.tiny import FIXTURE_SPECS, write_checkpoint

PROMPT = [5, 17, 42, 7, 99, 3]


def logits(loaded: Any, tokens: list[int] = PROMPT) -> np.ndarray:
    return np.array(loaded.model(mx.array(tokens)[None])[0])  # (T, V)


def edit_config(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_5_moe"])
def test_load_fixture(model_type: str, loaded_model: Callable[[str], Any]) -> None:
    loaded = loaded_model(model_type)
    assert isinstance(loaded, edge0.LoadedModel)
    assert loaded.source_format == "hf"
    assert loaded.config["model_type"] == model_type
    assert loaded.text_config["num_experts"] == 8
    assert loaded.context_length == 256
    assert type(loaded.model).__module__ == f"mlx_lm.models.{model_type}"
    # Stored bf16, computed fp32 on the CPU backend.
    dtypes = {v.dtype for _, v in tree_flatten(loaded.model.parameters())}
    assert dtypes == {mx.float32}
    assert activation_dtype(mx.bfloat16) == mx.float32
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("def f(x):")) == "def f(x):"


def test_fixtures_are_reproducible(tmp_path: Path) -> None:
    # tools/make_fixture.py is deterministic, so the committed golden logits stay valid.
    for name, (spec, shards) in FIXTURE_SPECS.items():
        out = write_checkpoint(spec, tmp_path / name, shards=shards)
        committed = Path(__file__).parent / "fixtures" / name
        files = sorted(p.name for p in committed.iterdir())
        assert sorted(p.name for p in out.iterdir()) == files
        for f in files:
            if f != "config.json":  # it records the transformers version
                assert (out / f).read_bytes() == (committed / f).read_bytes(), f


def test_qwen3_5_text_only_layout_matches(
    model_copy: Callable[[str], Path], loaded_model: Any
) -> None:
    # transformers' Qwen3_5MoeForCausalLM layout: flat config (qwen3_5_moe_text), "model." keys.
    path = model_copy("qwen3_5_moe")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config["text_config"]))
    weights = mx.load(str(path / "model.safetensors"))
    assert isinstance(weights, dict)
    renamed = {k.replace("model.language_model.", "model."): v for k, v in weights.items()}
    mx.save_safetensors(str(path / "model.safetensors"), renamed)
    text_only = load(path)
    assert text_only.config["model_type"] == "qwen3_5_moe_text"
    assert np.array_equal(logits(text_only), logits(loaded_model("qwen3_5_moe")))


def test_qwen3_moe_legacy_config_matches(
    model_copy: Callable[[str], Path], loaded_model: Any
) -> None:
    # Released Qwen3 MoE configs say num_experts / rope_theta (transformers 5 writes
    # num_local_experts / rope_parameters); both must load to the same model.
    path = model_copy("qwen3_moe")

    def legacy(c: dict[str, Any]) -> None:
        c["num_experts"] = c.pop("num_local_experts")
        c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]

    edit_config(path, legacy)
    assert np.array_equal(logits(load(path)), logits(loaded_model("qwen3_moe")))


def test_sharded_checkpoint_uses_index(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_moe")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors.*missing"):
        load(path)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_5_moe"])
def test_mlx_quantized_directory(model_type: str, tmp_path: Path) -> None:
    from mlx_lm.utils import quantize_model, save_config, save_model

    from edge0.kernels.layers import use_native

    src = Path(__file__).parent / "fixtures" / model_type
    source = load(src)
    source.model.set_dtype(mx.bfloat16)  # mlx-community checkpoints are bf16
    model, config = quantize_model(source.model, dict(source.config), group_size=32, bits=4)
    out = tmp_path / "mlx-4bit"
    save_model(out, model)
    save_config(config, out / "config.json")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, out / f)

    loaded = load(out)
    assert loaded.source_format == "mlx"
    # (the native kernels' subclasses count as what they subclass: edge0.kernels.layers)
    kinds = {c.__name__ for _, m in loaded.model.named_modules() for c in type(m).__mro__}
    assert {"QuantizedSwitchLinear", "QuantizedLinear"} <= kinds
    model.set_dtype(mx.float32)  # same weights, scales upcast as edge0 does on CPU
    use_native(model)  # and the same matrix kernels as a loaded model (edge0.kernels)
    np.testing.assert_allclose(
        logits(loaded), np.array(model(mx.array(PROMPT)[None])[0]), atol=1e-5
    )


def test_build_model_has_structure_only(loaded_model: Callable[[str], Any]) -> None:
    config = loaded_model("qwen3_5_moe").config
    model = build_model(config)
    assert isinstance(model, nn.Module)
    assert type(model) is type(loaded_model("qwen3_5_moe").model)
    quantized = build_model({**config, "quantization": {"group_size": 32, "bits": 4}})
    kinds = {type(m).__name__ for _, m in quantized.named_modules()}
    assert "QuantizedSwitchLinear" in kinds


def test_edge0_layout_dispatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import edge0.model.loader as loader

    (tmp_path / "edge0.json").write_text("{}")
    seen: list[Path] = []
    monkeypatch.setattr(loader, "load_layout", lambda p: seen.append(p) or "layout")
    assert load(tmp_path) == "layout"  # type: ignore[comparison-overlap]
    assert seen == [tmp_path]


# Bad input: one-line ModelLoadError naming the file and the fix.


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"nope: no such model directory; check the path"):
        load(tmp_path / "nope")


def test_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config.json: not found"):
        load(tmp_path)


def test_missing_weights(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_5_moe")
    (path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no model\*.safetensors weights found"):
        load(path)


@pytest.mark.parametrize(
    ("model_type", "message"),
    [
        ("qwen3", "'qwen3' is a dense model: it has no experts to stream"),
        ("llama", "'llama' is a dense model: it has no experts to stream"),
        (
            "frobnicator",
            "'frobnicator' is a Mixture-of-Experts family Edge0 does not support yet; "
            "supported: deepseek_v2, deepseek_v3, glm4_moe, gpt_oss, granitemoe, kimi_k2, llama4, "
            "mixtral, olmoe, qwen2_moe, ",
        ),
    ],
)
def test_unsupported_model_type(
    model_copy: Callable[[str], Path], model_type: str, message: str
) -> None:
    path = model_copy("qwen3_moe")
    edit_config(path, lambda c: c.update(model_type=model_type))
    with pytest.raises(ModelLoadError, match=message) as info:
        load(path)
    assert str(path / "config.json") in str(info.value)


def test_moe_type_with_zero_experts(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_5_moe")
    edit_config(path, lambda c: c["text_config"].update(num_experts=0))
    with pytest.raises(ModelLoadError, match="dense model: it has no experts to stream"):
        load(path)


def test_irregular_layer_types_are_built_as_written(model_copy: Callable[[str], Path]) -> None:
    """An irregular layer_types is honoured, not refused nor replaced by the interval rule: layer 0
    becomes full attention, so the checkpoint's linear-attention weights for it are named as extra
    (irregular patterns against transformers: tests/test_fidelity.py)."""
    path = model_copy("qwen3_5_moe")
    types = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
    edit_config(path, lambda c: c["text_config"].update(layer_types=types))
    with pytest.raises(ModelLoadError, match=r"do not match config.json.*layers\.0\.linear_attn"):
        load(path)


@pytest.mark.parametrize("keep", [0, 4, 100, -1000])
def test_truncated_safetensors(model_copy: Callable[[str], Path], keep: int) -> None:
    path = model_copy("qwen3_5_moe")
    file = path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    with pytest.raises(ModelLoadError, match="re-download or re-convert") as info:
        load(path)
    assert str(file) in str(info.value)
    assert "\n" not in str(info.value)


def test_corrupt_safetensors_header(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_5_moe")
    file = path / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:16] = b"@@@@@@@@"  # the JSON header starts at byte 8
    file.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt safetensors header"):
        load(path)


def test_weights_not_matching_config(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_moe")
    edit_config(path, lambda c: c.update(num_hidden_layers=3))
    with pytest.raises(ModelLoadError, match="weights do not match config.json"):
        load(path)


def test_missing_tokenizer(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_moe")
    (path / "tokenizer.json").unlink()
    (path / "tokenizer_config.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        load(path)


def test_hf_quantized_checkpoint_is_refused(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_moe")
    edit_config(path, lambda c: c.update(quantization_config={"quant_method": "fp8"}))
    with pytest.raises(ModelLoadError, match="quant_method 'fp8'.* is not supported; use the bf16"):
        load(path)


def test_missing_expert_tensor(model_copy: Callable[[str], Path]) -> None:
    path = model_copy("qwen3_moe")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard = path / index["weight_map"]["model.layers.1.mlp.experts.3.up_proj.weight"]
    weights = mx.load(str(shard))
    assert isinstance(weights, dict)
    del weights["model.layers.1.mlp.experts.3.up_proj.weight"]
    mx.save_safetensors(str(shard), weights)
    with pytest.raises(ModelLoadError, match="weights do not match config.json.*experts.3"):
        load(path)
