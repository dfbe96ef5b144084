"""Merging an adapter into int4 projections: same adapter, float-exact before requantization."""

from __future__ import annotations

import lora_tiny as tiny
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from edge0.model import lora
from edge0.model.merge import merge_lora


def adapted(make, b_std: float, seed: int = 0):
    model = tiny.build(make(), seed=seed)
    lora.apply_lora(model, lora.LoraConfig(rank=4, alpha=8))
    mx.random.seed(7)
    for _, m in lora.lora_modules(model):
        m.lora_b = b_std * mx.random.normal(m.lora_b.shape)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("make", [tiny.qwen3_moe_config, tiny.qwen3_5_moe_config])
def test_merged_before_requantization_matches_unmerged(make):
    model = adapted(make, 0.05)
    x = tiny.tokens()
    unmerged = np.array(model(x))
    stats = merge_lora(model, requantize=False)
    assert stats.modules > 0 and lora.lora_paths(model) == []
    np.testing.assert_allclose(np.array(model(x)), unmerged, rtol=1e-4, atol=1e-4)
    assert stats.retained == pytest.approx(1.0, abs=1e-5)


def test_requantized_merge_is_computed_from_the_same_adapter():
    model = adapted(tiny.qwen3_moe_config, 0.05)
    path, m = lora.lora_modules(model)[0]
    base = m.linear
    # The merged weight, by hand: dequantize the int4 base, add scale * B^T A^T, requantize.
    w = mx.dequantize(base.weight, base.scales, base.biases, group_size=32, bits=4)
    d = m.scale * (m.lora_b.T @ m.lora_a.T)
    wq, sq, bq = mx.quantize(w + d, group_size=32, bits=4)
    merge_lora(model, requantize=True)
    merged = dict(model.named_modules())[path]
    assert isinstance(merged, nn.QuantizedLinear)
    assert (merged.group_size, merged.bits) == (32, 4)
    assert np.array_equal(np.array(merged.weight), np.array(wq))
    np.testing.assert_allclose(np.array(merged.scales), np.array(sq), rtol=1e-6)
    np.testing.assert_allclose(np.array(merged.biases), np.array(bq), rtol=1e-6, atol=1e-7)


def test_requantization_drowns_small_updates_and_keeps_large_ones():
    small = merge_lora(adapted(tiny.qwen3_moe_config, 1e-4), requantize=True)
    large = merge_lora(adapted(tiny.qwen3_moe_config, 2.0), requantize=True)
    assert small.residual > 1.0 > 0.2 > large.residual  # rounding noise vs the update
    assert large.retained == pytest.approx(1.0, abs=0.05)
    zero = merge_lora(adapted(tiny.qwen3_moe_config, 0.0), requantize=True)
    assert zero.update_norm == 0.0 and zero.residual == 0.0


def test_requantized_merge_changes_logits_toward_unmerged():
    x = tiny.tokens()
    base = tiny.build(tiny.qwen3_moe_config())
    base_logits = np.array(base(x))
    model = adapted(tiny.qwen3_moe_config, 0.5)
    unmerged = np.array(model(x))
    merge_lora(model, requantize=True)
    merged = np.array(model(x))
    assert np.abs(merged - unmerged).mean() < np.abs(base_logits - unmerged).mean()
