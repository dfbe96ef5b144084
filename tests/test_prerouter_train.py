"""Traces alignment, head distillation and the routing evaluation, on a tiny qwen3_moe."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner
from mlx_lm.models.base import create_attention_mask

import edge0.model.loader
from edge0.cli import eval as eval_cmd
from edge0.cli import train as train_cmd
from edge0.eval.routing import evaluate_routing, markdown
from edge0.routing.prerouter import PrerouterSet, moe_blocks
from edge0.synth.tiny import TOKENIZER_TEXT, TinySpec, write_checkpoint
from edge0.train.heads import HeadTrainConfig, train_heads
from edge0.train.traces import NO_EXPERT, TraceSet, collect, head_rows


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinySpec(model_type="qwen3_moe", hidden=32, layers=3, experts=8, top_k=2)
    return write_checkpoint(spec, tmp_path_factory.mktemp("tiny"))


def _windows(n: int, s: int) -> np.ndarray:
    """Counting sequences: the next token follows from this one, so routing is learnable."""
    return ((np.arange(n)[:, None] * 7 + np.arange(s)[None] * 3) % 250 + 5).astype(np.int32)


def _manual_routing(model: object, toks: mx.array) -> list[tuple[mx.array, mx.array]]:
    """(post-attention-norm hidden, router logits) per layer, by stepping the layers by hand."""
    inner = model.model  # type: ignore[attr-defined]
    h = inner.embed_tokens(toks)
    mask = create_attention_mask(h, None)
    out = []
    for layer in inner.layers:
        h = h + layer.self_attn(layer.input_layernorm(h), mask, None)
        x = layer.post_attention_layernorm(h)
        out.append((x, layer.mlp.gate(x)))
        h = h + layer.mlp(x)
    return out


def test_traces_align_target_at_next_token_next_layer(tiny: Path, tmp_path: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    win = _windows(6, 10)
    meta = collect(model, win, tmp_path, batch=4, shard_windows=4, progress=False)
    assert meta.shards == ("shard-00000.npz", "shard-00001.npz")
    ts = TraceSet.load(tmp_path)
    assert ts.hidden.shape == (6, 3, 10, 32) and ts.hidden.dtype == np.float16
    assert ts.topk.shape == (6, 3, 10, 2) and ts.logits.shape == (6, 3, 10, 8)
    ref = _manual_routing(model, mx.array(win))
    seqs, pos = np.array([0, 5, 3]), np.array([0, 4, 8])
    for a, b in ts.pairs():
        hidden, topk_t, prev, target = head_rows(ts, seqs, pos, a, b)
        want_h = np.array(ref[a][0])[seqs, pos]
        np.testing.assert_allclose(hidden, want_h, rtol=2e-3, atol=2e-3)  # stored as fp16
        np.testing.assert_allclose(target, np.array(ref[b][1])[seqs, pos + 1], rtol=1e-5, atol=1e-5)
        logits_a = np.array(ref[a][1])
        want_t = np.sort(np.argsort(-logits_a[seqs, pos], axis=-1)[:, :2], axis=-1)
        assert (topk_t == want_t).all()
        assert (prev[0] == NO_EXPERT).all()  # pos 0 has no previous token
        want_prev = np.sort(np.argsort(-logits_a[seqs[1:], pos[1:] - 1], axis=-1)[:, :2], axis=-1)
        assert (prev[1:] == want_prev).all()
    assert ts.pairs()[-1] == (2, 0)  # wrap-around head


def test_training_lowers_heldout_loss(tiny: Path, tmp_path: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    collect(model, _windows(24, 24), tmp_path, batch=8, progress=False)
    ts = TraceSet.load(tmp_path)
    init = PrerouterSet.from_model(model)
    cfg = HeadTrainConfig(k=2, batch=128, max_steps=60, eval_every=20, heldout_frac=0.25, lr=3e-3)
    trained, summary = train_heads(ts, init, cfg, progress=False)
    assert summary["heldout_loss"] < summary["heldout_loss_init"]
    assert summary["best_step"] > 0
    assert trained.config.trained and trained.config.info["k"] == 2
    assert set(summary["heldout_recall_per_head"]) == {"0", "1", "2"}


def test_eval_routing_scores_every_predictor(tiny: Path) -> None:
    model = edge0.model.loader.load(tiny).model
    heads = PrerouterSet.from_model(model)
    result = evaluate_routing(model, _windows(2, 12), [2, 1], trained=heads, progress=False)
    assert result["predictors"] == ["shuffle", "temporal", "init", "trained", "layer-init"]
    assert result["rows_per_head"] == 2 * 11
    for p in result["predictors"]:
        for k in ("2", "1"):
            m = result["mean"][p][k]
            assert 0.0 <= m["recall"] <= 1.0 and 0.0 <= m["exact"] <= m["recall"] + 1e-9
    # the untrained set *is* init: identical scores
    assert result["mean"]["trained"] == result["mean"]["init"]
    assert set(result["per_head"]) == {"0->1", "1->2", "2->0"}
    table = markdown(result)
    assert "| init |" in table and "recall@2" in table and "| trained @1 |" in table


def test_cli_traces_heads_eval(tiny: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text(TOKENIZER_TEXT * 12)
    (corpus / "heldout.txt").write_text(TOKENIZER_TEXT[::-1] * 6)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in tiny.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    runner = CliRunner()
    traces = tmp_path / "traces"
    r = runner.invoke(
        train_cmd.command,
        ["traces", str(model_dir), str(corpus), str(traces), "--tokens", "512", "--seq-len", "32"],
    )
    assert r.exit_code == 0, r.output
    assert json.loads((traces / "traces.json").read_text())["windows"] == 16
    r = runner.invoke(
        train_cmd.command,
        [
            "heads",
            str(traces),
            str(model_dir),
            "--k",
            "2",
            "--max-steps",
            "20",
            "--eval-every",
            "10",
            "--batch",
            "64",
        ],
    )
    assert r.exit_code == 0, r.output
    assert PrerouterSet.exists(model_dir)
    out = tmp_path / "routing.json"
    r = runner.invoke(
        eval_cmd.command,
        [
            "routing",
            str(model_dir),
            str(corpus),
            "--tokens",
            "64",
            "--seq-len",
            "32",
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    assert result["ks"] == [2, 1] and "trained" in result["predictors"]
    assert "| trained |" in r.output
    blocks = moe_blocks(edge0.model.loader.load(model_dir).model)
    assert result["num_experts"] == blocks[0][1].gate.weight.shape[0]
