"""LoRA layer, targets, apply/remove, adapter files (ours and mlx-lm's reader), runtime hook."""

from __future__ import annotations

import json
from pathlib import Path

import lora_tiny as tiny
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from edge0.errors import ConfigError, ModelLoadError
from edge0.model import lora

FAMILIES = [tiny.qwen3_moe_config, tiny.qwen3_5_moe_config]


def randomize_b(model, seed: int = 3) -> None:
    mx.random.seed(seed)
    for _, m in lora.lora_modules(model):
        m.lora_b = 0.05 * mx.random.normal(m.lora_b.shape)
    mx.eval(model.parameters())


@pytest.mark.parametrize("make", FAMILIES)
def test_zero_initialised_adapter_leaves_logits_unchanged(make):
    model = tiny.build(make())
    x = tiny.tokens()
    before = np.array(model(x))
    paths = lora.apply_lora(model, lora.LoraConfig(rank=4, alpha=8))
    assert paths  # something was wrapped
    after = np.array(model(x))
    assert np.array_equal(before, after)
    # ... and a non-zero B does change them (the branch is live).
    randomize_b(model)
    assert not np.allclose(before, np.array(model(x)), atol=1e-4)
    assert lora.remove_lora(model) == len(paths)
    assert np.array_equal(before, np.array(model(x)))


def test_default_targets_per_family():
    q3 = tiny.build(tiny.qwen3_moe_config(), quantize=False)
    assert lora.default_keys(q3) == tuple(f"self_attn.{p}_proj" for p in "koqv")
    q35 = tiny.build(tiny.qwen3_5_moe_config())
    keys = set(lora.default_keys(q35))
    assert {"linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj"} <= keys
    assert {"self_attn.q_proj", "self_attn.o_proj"} <= keys
    assert {f"mlp.shared_expert.{p}_proj" for p in ("gate", "up", "down")} <= keys
    assert not any("switch_mlp" in k or k in ("mlp.gate", "mlp.shared_expert_gate") for k in keys)
    lora.apply_lora(q35, lora.LoraConfig())
    # Full-attention layers get self_attn adapters, linear-attention layers linear_attn ones.
    paths = lora.lora_paths(q35)
    assert any(".layers.0.linear_attn.in_proj_qkv" in p for p in paths)
    assert any(".layers.1.self_attn.q_proj" in p for p in paths)
    assert not any("switch_mlp" in p for p in paths)


def test_bad_targets_are_config_errors():
    model = tiny.build(tiny.qwen3_moe_config())
    with pytest.raises(ConfigError, match="match no nn.Linear"):
        lora.apply_lora(model, lora.LoraConfig(keys=("self_attn.nope",)))
    with pytest.raises(ConfigError, match="routed expert"):
        lora.apply_lora(model, lora.LoraConfig(keys=("mlp.switch_mlp.up_proj",)))
    with pytest.raises(ConfigError, match="router"):
        lora.apply_lora(model, lora.LoraConfig(keys=("mlp.gate",)))
    with pytest.raises(ConfigError, match="rank"):
        lora.LoraConfig(rank=0)


def test_num_layers_counts_from_the_end():
    model = tiny.build(tiny.qwen3_moe_config(layers=3))
    paths = lora.apply_lora(model, lora.LoraConfig(num_layers=1))
    assert paths and all(".layers.2." in p for p in paths)


def test_mark_trainable_exposes_only_lora_matrices():
    model = tiny.build(tiny.qwen3_5_moe_config())
    lora.apply_lora(model, lora.LoraConfig(rank=2))
    n = lora.mark_trainable(model)
    names = [k for k, _ in tree_flatten(model.trainable_parameters())]
    assert names and all(k.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for k in names)
    assert n == sum(v.size for v in lora.adapter_weights(model).values())


@pytest.mark.parametrize("make", FAMILIES)
def test_save_load_roundtrip(make, tmp_path: Path):
    cfg = lora.LoraConfig(rank=4, alpha=12)
    model = tiny.build(make())
    lora.apply_lora(model, cfg)
    randomize_b(model)
    x = tiny.tokens()
    want = np.array(model(x))
    lora.save_adapters(model, tmp_path / "adapters", cfg, meta={"stage": "sft"})

    doc = json.loads((tmp_path / "adapters" / lora.CONFIG_FILE).read_text())
    assert doc["fine_tune_type"] == "lora"
    assert doc["num_layers"] == len(model.layers)
    assert doc["lora_parameters"]["rank"] == 4
    assert doc["lora_parameters"]["scale"] == pytest.approx(3.0)
    assert doc["edge0"] == {"stage": "sft"}

    fresh = tiny.build(make())  # same seed: same base weights
    assert lora.maybe_apply_adapters(fresh, tmp_path) is True
    got = np.array(fresh(x))
    assert np.array_equal(want, got)
    saved = lora.adapter_weights(model)
    for k, v in lora.adapter_weights(fresh).items():
        assert np.array_equal(np.array(v), np.array(saved[k])), k


@pytest.mark.parametrize("make", FAMILIES)
def test_mlx_lm_reads_our_adapter_files(make, tmp_path: Path):
    from mlx_lm.tuner.utils import load_adapters as mlx_lm_load_adapters

    cfg = lora.LoraConfig(rank=4, alpha=8)
    model = tiny.build(make())
    lora.apply_lora(model, cfg)
    randomize_b(model)
    x = tiny.tokens()
    want = np.array(model(x))
    lora.save_adapters(model, tmp_path, cfg)

    theirs = tiny.build(make())
    mlx_lm_load_adapters(theirs, str(tmp_path))
    np.testing.assert_allclose(np.array(theirs(x)), want, rtol=1e-5, atol=1e-5)


def test_runtime_hook_switch(tmp_path: Path):
    model = tiny.build(tiny.qwen3_moe_config())
    assert lora.maybe_apply_adapters(model, tmp_path) is False  # no adapters/ dir
    cfg = lora.LoraConfig(rank=2)
    lora.apply_lora(model, cfg)
    lora.save_adapters(model, tmp_path / lora.ADAPTER_DIR, cfg)
    fresh = tiny.build(tiny.qwen3_moe_config())
    assert lora.maybe_apply_adapters(fresh, tmp_path, enabled=False) is False
    assert lora.lora_paths(fresh) == []
    assert lora.maybe_apply_adapters(fresh, tmp_path) is True
    assert lora.lora_paths(fresh) == lora.lora_paths(model)


def test_adapter_for_another_model_is_a_load_error(tmp_path: Path):
    cfg = lora.LoraConfig(rank=2)
    small = tiny.build(tiny.qwen3_moe_config(layers=2))
    lora.apply_lora(small, cfg)
    lora.save_adapters(small, tmp_path, cfg)
    other = tiny.build(tiny.qwen3_5_moe_config())
    with pytest.raises(ModelLoadError, match="adapters.safetensors does not match"):
        lora.load_adapters(other, tmp_path)
    assert lora.lora_paths(other) == []  # left as it was
    (tmp_path / lora.CONFIG_FILE).write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        lora.load_adapters(small, tmp_path)


def test_dropout_only_in_train_mode():
    import mlx.nn as nn

    layer = lora.LoRALinear(nn.Linear(32, 16), rank=4, scale=2.0, dropout=0.5)
    layer.lora_b = mx.ones(layer.lora_b.shape)
    x = mx.ones((3, 32))
    layer.eval()
    clean = np.array(layer(x))
    want = np.array(layer.linear(x) + 2.0 * (x @ layer.lora_a) @ layer.lora_b)
    np.testing.assert_allclose(clean, want, rtol=1e-5, atol=1e-5)
    layer.train()
    mx.random.seed(0)
    assert not np.allclose(np.array(layer(x)), clean, atol=1e-3)
