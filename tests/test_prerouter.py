"""Prerouter head module: untrained head == next router, save/load roundtrip, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import edge0.model.loader
from edge0.errors import CheckpointError
from edge0.kernels.layers import use_native
from edge0.routing.prerouter import PrerouterConfig, PrerouterSet, moe_blocks, multi_hot
from edge0.synth.tiny import TinySpec, write_checkpoint
from edge0.train.capture import fake_quantize_student, quantize_student, run_and_record


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_5_moe"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinySpec(model_type=request.param, hidden=64, layers=4, experts=8, top_k=2)
    return write_checkpoint(spec, tmp_path_factory.mktemp(request.param))


def _tokens(n: int = 2, s: int = 12) -> mx.array:
    return mx.array(np.random.default_rng(1).integers(5, 200, (n, s)).astype(np.int32))


def test_untrained_head_is_next_router_exactly(tiny: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    heads = PrerouterSet.from_model(model)
    for head in heads.heads.values():  # as the runtime runs them: the router's own kernel
        use_native(head)
    blocks = dict(moe_blocks(model))
    r = run_and_record(model, _tokens(), np.dtype(np.float32))
    for a, (owner, target) in enumerate(heads.config.heads()):
        hidden = mx.array(r.hidden[:, a])  # (B, S, d)
        topk = mx.array(r.topk[:, a].astype(np.int32))
        got = heads.predict(owner, hidden, topk, mx.roll(topk, 1, 1))
        want = blocks[target].gate(hidden)
        assert mx.array_equal(got, want).item(), (owner, target)
    # wrap-around: the last MoE layer's head targets the first MoE layer
    assert heads.target[heads.config.moe_layers[-1]] == heads.config.moe_layers[0]


def test_multi_hot_pads_and_counts() -> None:
    idx = mx.array([[0, 3], [-1, -1]])
    got = multi_hot(idx, 5, (2,))
    assert got.tolist() == [[1, 0, 0, 1, 0], [0, 0, 0, 0, 0]]
    assert multi_hot(None, 4, (3,)).shape == (3, 4)


def test_save_load_roundtrip(tiny: Path, tmp_path: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    heads = PrerouterSet.from_model(model, hidden=24)
    for head in heads.heads.values():  # make every parameter non-trivial
        head.update(
            {
                "fc2": {
                    "weight": mx.random.normal(head.fc2.weight.shape),
                    "bias": mx.random.normal(head.fc2.bias.shape),
                }
            }
        )
    heads.save(tmp_path)
    back = PrerouterSet.load(tmp_path)
    assert back.config == heads.config and back.config.hidden == 24
    a, b = heads.parameters_flat(), back.parameters_flat()
    assert a.keys() == b.keys()
    assert all(mx.array_equal(a[k], b[k]).item() for k in a)
    back.check_model(model)
    h = mx.random.normal((3, heads.config.d_model))
    owner = heads.config.moe_layers[0]
    topk = mx.array([[0, 1], [2, 3], [4, 5]])
    assert mx.array_equal(
        heads.predict(owner, h, topk, None), back.predict(owner, h, topk, None)
    ).item()
    assert back.predict_topk(owner, h, topk, None, 2).shape == (3, 2)


def test_load_errors_name_the_file(tmp_path: Path, tiny: Path) -> None:
    with pytest.raises(CheckpointError, match="prerouter.safetensors"):
        PrerouterSet.load(tmp_path)
    model = edge0.model.loader.load(tiny).model
    heads = PrerouterSet.from_model(model)
    heads.save(tmp_path)
    cfg = json.loads((tmp_path / "prerouter.json").read_text())
    cfg["format_version"] = 99
    (tmp_path / "prerouter.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="format_version"):
        PrerouterSet.load(tmp_path)
    cfg["format_version"] = 1
    cfg["hidden"] = cfg["hidden"] + 1  # weights no longer match the config
    (tmp_path / "prerouter.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="head of layer"):
        PrerouterSet.load(tmp_path)


def test_check_model_rejects_other_models(tiny: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    heads = PrerouterSet.from_model(model)
    other = PrerouterSet(
        PrerouterConfig(
            d_model=heads.config.d_model,
            num_experts=heads.config.num_experts,
            top_k=2,
            hidden=8,
            moe_layers=(0, 1),
        ),
        {},
    )
    heads.check_model(model)
    with pytest.raises(CheckpointError, match="retrain"):
        other.check_model(model)


def test_student_path_head_inits_from_dequantized_router(tiny: Path) -> None:
    model = quantize_student(edge0.model.loader.load(tiny).model)
    heads = PrerouterSet.from_model(model)
    blocks = dict(moe_blocks(model))
    owner, target = heads.config.heads()[0]
    assert isinstance(blocks[target].gate, nn.QuantizedLinear)
    h = mx.random.normal((4, heads.config.d_model))
    got = heads.predict(owner, h, None, None)
    want = blocks[target].gate(h)  # 8-bit quantized router
    assert mx.allclose(got, want, atol=1e-4).item()


def test_fake_quantized_student_matches_int4_path(tiny: Path) -> None:
    real = quantize_student(edge0.model.loader.load(tiny).model)
    fake = fake_quantize_student(edge0.model.loader.load(tiny).model)
    full = edge0.model.loader.load(tiny).model
    toks = _tokens(2, 16)
    r, f, t = (run_and_record(m, toks, np.dtype(np.float32)) for m in (real, fake, full))
    np.testing.assert_allclose(f.hidden, r.hidden, atol=1e-4)
    np.testing.assert_allclose(f.logits, r.logits, atol=1e-4)
    assert np.abs(t.hidden - r.hidden).max() > 1e-3  # int4 really changed the path


TEACHER = Path(__file__).parent.parent / "edge0" / "data" / "teacher"


@pytest.mark.skipif(not (TEACHER / "model.safetensors").exists(), reason="demo teacher not present")
def test_shipped_heads_fit_the_shipped_teacher() -> None:
    loaded = edge0.model.loader.load(TEACHER)
    heads = PrerouterSet.load(TEACHER)
    heads.check_model(loaded.model)
    assert heads.config.trained and heads.config.wrap
    # trained heads beat the untrained ones on the teacher's own text (a routing-recall smoke test)
    from edge0.eval.routing import evaluate_routing

    text = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    ids = loaded.tokenizer.encode(text * 4)[:96]
    result = evaluate_routing(
        loaded.model, np.array([ids], dtype=np.int32), [4], heads, progress=False
    )
    assert result["mean"]["trained"]["4"]["recall"] > result["mean"]["init"]["4"]["recall"]
