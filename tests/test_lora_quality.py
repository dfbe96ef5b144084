"""eval_quality: metric arithmetic, variants on a tiny student, merged row from the same adapter."""

from __future__ import annotations

from pathlib import Path

import lora_tiny as tiny
import mlx.core as mx
import numpy as np
import pytest

from edge0.eval import quality as eq
from edge0.model import lora
from edge0.routing.prerouter import PrerouterSet


def test_token_stats_of_identical_models():
    mx.random.seed(0)
    logits = mx.random.normal((2, 5, 16))
    targets = mx.random.randint(0, 16, (2, 5))
    stats = eq.token_stats(logits, logits, targets)
    assert np.allclose(stats["kl"], 0.0, atol=1e-6) and stats["agree"].min() == 1.0
    s = eq.summarize(stats, np.array([3, 3]))
    assert s["ppl_ratio"] == pytest.approx(1.0) and s["tokens"] == 10
    other = eq.token_stats(logits, logits * 0.5, targets)
    assert other["kl"].mean() > 0.0


def test_first_divergence():
    a = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [5, 5, 5, 5]])
    b = np.array([[1, 2, 0, 4], [1, 2, 3, 4], [0, 5, 5, 5]])
    assert eq.first_divergence(a, b).tolist() == [2, 4, 0]


def test_variants_on_a_tiny_student(tmp_path: Path):
    make = tiny.qwen3_moe_config
    teacher = tiny.build(make(), quantize=False)
    student = tiny.build(make(), quantize=True)
    heads = {"init": PrerouterSet.from_model(student)}
    cfg = lora.LoraConfig(rank=4, alpha=8)
    lora.apply_lora(student, cfg)
    lora.save_adapters(student, tmp_path / "zero", cfg)  # B = 0
    mx.random.seed(3)
    for _, m in lora.lora_modules(student):
        m.lora_b = 0.5 * mx.random.normal(m.lora_b.shape)
    lora.save_adapters(student, tmp_path / "big", cfg)
    lora.remove_lora(student)
    x = tiny.tokens(n=8)
    before = np.array(student(x))

    windows = np.array(tiny.tokens(n=9, batch=3, seed=4))
    prompts = np.array(tiny.tokens(n=3, batch=2, seed=6))
    variants = [
        eq.Variant("int4-resident", "resident"),
        eq.Variant("route-init", "init"),
        eq.Variant("lora-sft", "init", tmp_path / "zero"),
        eq.Variant("lora-distill", "init", tmp_path / "big"),
        eq.Variant("lora-merged", "init", tmp_path / "big", merged=True),
    ]
    result = eq.evaluate_quality(teacher, student, variants, heads, 1, windows, prompts, 4, batch=2)
    rows = {r["variant"]: r for r in result["rows"]}
    assert rows["int4-resident"]["k"] == 2 and rows["route-init"]["k"] == 1
    assert rows["int4-resident"]["tokens"] == 3 * 8
    # Routing at K=1 is worse than the true top-2; a zero adapter changes nothing.
    assert rows["route-init"]["kl_mean"] > rows["int4-resident"]["kl_mean"] > 0
    for key in ("kl_mean", "kl_p99", "top1_agree", "ppl_ratio", "first_divergence_mean"):
        assert rows["lora-sft"][key] == rows["route-init"][key], key
    # The merged row comes from the same adapter file: same modules, same update norm.
    mw = rows["lora-merged"]["merge_weights"]
    assert mw["modules"] == 8 and mw["update_norm"] > 0
    assert rows["lora-merged"]["kl_mean"] != rows["lora-distill"]["kl_mean"]
    d = result["derived"]
    base, s3, mg = (rows[n]["kl_mean"] for n in ("route-init", "lora-distill", "lora-merged"))
    assert d["kl_gap_closed"] == pytest.approx((base - s3) / base)
    assert d["merge_retention"] == pytest.approx((base - mg) / (base - s3))
    # The student is left exactly as it was (no adapters, same logits).
    assert lora.lora_paths(student) == []
    assert np.array_equal(np.array(student(x)), before)
    md = eq.markdown(result)
    assert "| lora-merged | init |" in md and "surviving merge" in md
