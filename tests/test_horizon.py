"""Layer-horizon prerouter heads: same-token next-layer trace pairing, init rule, files, eval."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner
from test_prerouter_train import _manual_routing, _windows

import edge0.model.loader
from edge0.cli import eval as eval_cmd
from edge0.cli import train as train_cmd
from edge0.errors import CheckpointError
from edge0.eval.routing import _hot, evaluate_routing, markdown
from edge0.kernels.layers import use_native
from edge0.model.demo import TEACHER_DIR
from edge0.routing.prerouter import FILES, PrerouterSet, moe_blocks
from edge0.synth.tiny import TOKENIZER_TEXT, TinySpec, write_checkpoint
from edge0.train.heads import HeadTrainConfig, train_heads
from edge0.train.traces import NO_EXPERT, TraceSet, collect, head_rows


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinySpec(model_type="qwen3_moe", hidden=32, layers=3, experts=8, top_k=2)
    return write_checkpoint(spec, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def traces(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("traces")
    collect(edge0.model.loader.load(tiny).model, _windows(24, 24), out, batch=8, progress=False)
    return out


def test_layer_rows_target_the_same_tokens_next_layer(tiny: Path, tmp_path: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    win = _windows(4, 10)
    collect(model, win, tmp_path, batch=4, progress=False)
    ts = TraceSet.load(tmp_path)
    ref = _manual_routing(model, mx.array(win))
    seqs, pos = np.array([0, 3, 2, 1]), np.array([0, 4, 8, 9])  # t = S-1 is a valid layer row
    assert ts.pairs(wrap=False) == [(0, 1), (1, 2)]
    for a, b in ts.pairs(wrap=False):
        hidden, topk_t, prev, target = head_rows(ts, seqs, pos, a, b, lead=0)
        np.testing.assert_allclose(hidden, np.array(ref[a][0])[seqs, pos], rtol=2e-3, atol=2e-3)
        same = np.array(ref[b][1])[seqs, pos]  # layer b's router logits at the SAME token
        np.testing.assert_allclose(target, same, rtol=1e-5, atol=1e-5)
        later = np.array(ref[b][1])[seqs[:3], pos[:3] + 1]
        assert not np.allclose(target[:3], later, atol=1e-3)  # not the token-horizon target
        want_t = np.sort(np.argsort(-np.array(ref[a][1])[seqs, pos], axis=-1)[:, :2], axis=-1)
        assert (topk_t == want_t).all() and (prev[0] == NO_EXPERT).all()
    with pytest.raises(ValueError, match="lead 2"):
        head_rows(ts, seqs, pos, 0, 1, lead=2)


def test_untrained_layer_head_is_the_next_router_on_this_hidden(tiny: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    heads = PrerouterSet.from_model(model, horizon="layer")
    for head in heads.heads.values():  # as the runtime runs them: the router's own kernel
        use_native(head)
    assert heads.config.horizon == "layer" and not heads.config.wrap
    assert heads.config.heads() == [(0, 1), (1, 2)]  # no wrap-around head
    blocks = dict(moe_blocks(model))
    ref = _manual_routing(model, mx.array(_windows(2, 7)))
    for a, b in heads.config.heads():
        hidden = ref[a][0]
        topk = mx.argpartition(-ref[a][1], kth=1, axis=-1)[..., :2]
        got = heads.predict(a, hidden, topk, None)
        assert mx.array_equal(got, blocks[b].gate(hidden))  # bit-exact


def test_layer_heads_train_on_same_token_targets(tiny: Path, traces: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    ts = TraceSet.load(traces)
    cfg = HeadTrainConfig(k=2, batch=128, max_steps=60, eval_every=20, heldout_frac=0.25, lr=3e-3)
    trained, summary = train_heads(ts, PrerouterSet.from_model(model, horizon="layer"), cfg, False)
    assert summary["horizon"] == "layer" and trained.config.horizon == "layer"
    assert set(summary["heldout_recall_per_head"]) == {"0", "1"}
    assert summary["heldout_loss"] < summary["heldout_loss_init"]


def test_save_load_roundtrip_keeps_token_heads(tiny: Path, traces: Path, tmp_path: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    ts = TraceSet.load(traces)
    cfg = HeadTrainConfig(k=2, batch=64, max_steps=10, eval_every=5, heldout_frac=0.25)
    token, _ = train_heads(ts, PrerouterSet.from_model(model), cfg, False)
    layer, _ = train_heads(ts, PrerouterSet.from_model(model, horizon="layer"), cfg, False)
    token.save(tmp_path)
    before = (tmp_path / FILES["token"][0]).read_bytes()
    layer.save(tmp_path)
    assert (tmp_path / FILES["token"][0]).read_bytes() == before  # not clobbered
    assert PrerouterSet.exists(tmp_path, "layer") and PrerouterSet.exists(tmp_path)
    back_t, back_l = PrerouterSet.load(tmp_path), PrerouterSet.load(tmp_path, "layer")
    assert back_t.config == token.config and back_l.config == layer.config
    x = mx.random.normal((5, 32), key=mx.random.key(1))
    topk = mx.array([[0, 1]] * 5)
    for owner in layer.heads:
        assert mx.array_equal(
            back_l.predict(owner, x, topk, None), layer.predict(owner, x, topk, None)
        )
        assert mx.array_equal(
            back_t.predict(owner, x, topk, None), token.predict(owner, x, topk, None)
        )
    # the horizon is checked, and a directory without layer heads says how to make them
    (tmp_path / FILES["token"][1]).write_text((tmp_path / FILES["layer"][1]).read_text())
    with pytest.raises(CheckpointError, match="'layer'-horizon heads, expected 'token'"):
        PrerouterSet.load(tmp_path)
    with pytest.raises(CheckpointError, match="--horizon layer"):
        PrerouterSet.load(tmp_path / "missing", "layer")


def test_shipped_heads_still_load_as_token_heads() -> None:
    heads = PrerouterSet.load(TEACHER_DIR)
    assert heads.config.horizon == "token" and heads.config.wrap and heads.config.trained


def test_eval_scores_layer_predictors_against_the_same_token(tiny: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    win = _windows(2, 12)
    layer = PrerouterSet.from_model(model, horizon="layer")
    result = evaluate_routing(model, win, [2], layer_trained=layer, progress=False)
    assert result["predictors"] == ["shuffle", "temporal", "init", "layer-init", "layer-trained"]
    assert "layer-init" not in result["per_head"]["2->0"]  # no wrap head at layer horizon
    assert result["mean"]["layer-trained"] == result["mean"]["layer-init"]  # untrained = init
    ref = _manual_routing(model, mx.array(win))
    blocks = dict(moe_blocks(model))
    for a, b in ((0, 1), (1, 2)):
        pred = blocks[b].gate(ref[a][0])[:, :-1]  # next router on this hidden, t in [0, S-2]
        truth = ref[b][1][:, :-1]  # next layer's logits at the same token
        want = float(mx.mean(mx.sum(_hot(pred, 2) * _hot(truth, 2), axis=-1) / 2))
        assert result["per_head"][f"{a}->{b}"]["layer-init"]["2"]["recall"] == pytest.approx(
            want, abs=1e-6
        )
    table = markdown(result)
    assert "| layer-trained |" in table and "| layer-init @2 |" in table


def test_cli_heads_horizon_layer_then_eval(tiny: Path, traces: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in tiny.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    corpus = tmp_path / "heldout.txt"
    corpus.write_text(TOKENIZER_TEXT[::-1] * 6)
    runner = CliRunner()
    args = ["heads", str(traces), str(model_dir), "--max-steps", "10", "--eval-every", "5"]
    r = runner.invoke(train_cmd.command, [*args, "--batch", "64", "--horizon", "layer"])
    assert r.exit_code == 0, r.output
    assert "layer-horizon held-out recall@2" in r.output
    assert PrerouterSet.exists(model_dir, "layer") and not PrerouterSet.exists(model_dir)
    r = runner.invoke(
        eval_cmd.command,
        ["routing", str(model_dir), str(corpus), "--tokens", "64", "--seq-len", "32"],
    )
    assert r.exit_code == 0, r.output
    assert "| layer-trained |" in r.output and "| layer-init |" in r.output
