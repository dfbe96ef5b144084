"""`edge0 tune`: streamed traces equal the resident model's routing, a killed run resumes, and
the validated heads switch the default mode to route."""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner

from edge0.cli.main import main
from edge0.layout.load import load_layout
from edge0.routing.validation import ROUTE_FLOOR, Validation
from edge0.train.capture import run_and_record
from edge0.tune.pipeline import TuneOptions, tune
from edge0.tune.store import TraceStore

SMALL = dict(tokens=512, heldout_tokens=256, validate_tokens=64, seq_len=32, max_steps=40)


@pytest.fixture(scope="module", autouse=True)
def _one_stdlib_walk() -> Iterator[None]:
    """The standard library's text, walked once for the module (each tune run walks every
    stdlib file name, ~0.5 s); the same arguments give the same Corpus."""
    from edge0.tune import corpus

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(corpus, "builtin", functools.cache(corpus.builtin))
        yield


@pytest.fixture()
def layout(runtime_stores: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(runtime_stores["qwen3_moe"], tmp_path / "m"))


class Stop(Exception):
    pass


def test_streamed_traces_equal_the_resident_models_routing(layout: Path, tmp_path: Path) -> None:
    """The recorders around the streamed blocks keep what the int4 model computes resident."""
    opts = TuneOptions(work_dir=tmp_path / "w", **SMALL)  # type: ignore[arg-type]

    def stop_after_traces(phase: str, done: int, total: int) -> None:
        if not phase.startswith("traces"):  # the traces are on disk; heads are not looked at
            raise Stop

    with pytest.raises(Stop):
        asyncio.run(tune(layout, opts, stop_after_traces))
    store = TraceStore.open(
        tmp_path / "w" / "train", _shape(tmp_path / "w" / "train"), _key(tmp_path)
    )
    ts = store.trace_set("", "")
    resident = load_layout(layout, experts="resident").model
    want = run_and_record(resident, mx.array(np.asarray(store.tokens()[:4])), np.dtype(np.float16))
    assert np.array_equal(np.asarray(ts.topk[:4]), want.topk)
    np.testing.assert_allclose(np.asarray(ts.logits[:4]), want.logits, atol=1e-4, rtol=0)
    np.testing.assert_allclose(
        np.asarray(ts.hidden[:4], dtype=np.float32), want.hidden.astype(np.float32), atol=2e-3
    )


def _state(root: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((root / "state.json").read_text())
    return state


def _shape(root: Path) -> Any:
    from edge0.tune.store import Shape

    s = _state(root)["shape"]
    return Shape(**{**s, "moe_layers": tuple(s["moe_layers"])})


def _key(tmp_path: Path) -> str:
    return str(_state(tmp_path / "w" / "train")["key"])


def test_a_killed_run_resumes_after_its_last_window(layout: Path, tmp_path: Path) -> None:
    opts = TuneOptions(work_dir=tmp_path / "w", **SMALL)  # type: ignore[arg-type]
    seen: list[int] = []

    def kill_at_third(phase: str, done: int, total: int) -> None:
        if phase == "traces (train)":
            seen.append(done)
            if done == 2 * opts.seq_len:
                raise Stop

    with pytest.raises(Stop):
        asyncio.run(tune(layout, opts, kill_at_third))
    assert _state(tmp_path / "w" / "train")["done"] == 2  # two windows on disk
    again: list[int] = []
    asyncio.run(
        tune(layout, opts, lambda p, d, t: again.append(d) if p == "traces (train)" else None)
    )
    assert again[0] == 2 * opts.seq_len  # started at the third window
    assert Validation.read(layout) is not None


def test_tune_validates_and_the_record_decides_the_default(layout: Path, tmp_path: Path) -> None:
    def run() -> str:
        args = ["run", str(layout), "-p", "def f(x):", "--max-tokens", "3", "--tiers", "pread"]
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        return str(res.stderr.strip().splitlines()[-1])

    assert run().endswith("| exact")
    args = ["tune", str(layout), "--work-dir", str(tmp_path / "w"), "--tiers", "pread"]
    args += ["--tokens", "512", "--heldout-tokens", "256", "--validate-tokens", "64"]
    res = CliRunner().invoke(main, [*args, "--seq-len", "32", "--max-minutes", "0.5"])
    assert res.exit_code == 0, res.output
    record = Validation.read(layout)
    assert record is not None and 0.0 <= record.agreement <= 1.0 and record.tokens > 0
    assert "route vs exact on" in res.output and f"{record.agreement:.1%}" in res.output
    # off a terminal each phase still says where it is: its start and its end, on stderr
    assert "tune: traces (train) 0/512 tok" in res.stderr
    assert "tune: traces (train) 512/512 tok" in res.stderr
    assert "tune: heads (token horizon) started" in res.stderr
    assert "tune: heads (layer horizon) done in" in res.stderr
    if record.agreement >= ROUTE_FLOOR:  # route by default, labelled with its agreement
        assert run().endswith(f"| approximate (route, agreement {record.agreement:.1%})")
    else:  # below the floor the layout keeps exact decoding, and tune says why
        assert run().endswith("| exact") and "keeps hint mode" in res.output
    config = json.loads((layout / "prerouter.json").read_text())
    assert config["trained"] and config["info"]["traces"]["source"] == "student-int4 (streamed)"
    layer = json.loads((layout / "prerouter-layer.json").read_text())  # the deadline policy's
    assert layer["trained"] and layer["horizon"] == "layer" and not layer["wrap"]
    assert layer["info"]["traces"]["key"] == config["info"]["traces"]["key"]
    assert "layer-horizon heads" in res.output and "layer_recall" in config["info"]["validation"]


def test_a_run_stopped_in_validation_does_not_train_again(
    layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge0.tune import pipeline

    opts = TuneOptions(work_dir=tmp_path / "w", **SMALL)  # type: ignore[arg-type]

    def stop_in_validation(phase: str, done: int, total: int) -> None:
        if phase.startswith("validate"):
            raise Stop

    with pytest.raises(Stop):
        asyncio.run(tune(layout, opts, stop_in_validation))
    assert Validation.read(layout) is None  # trained, not validated: exact stays the default
    weights = (layout / "prerouter.safetensors").read_bytes()
    trained = pipeline.train_heads
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return trained(*args, **kwargs)

    monkeypatch.setattr(pipeline, "train_heads", counted)
    asyncio.run(tune(layout, opts))
    assert not calls and (layout / "prerouter.safetensors").read_bytes() == weights
    assert Validation.read(layout) is not None
    other = TuneOptions(work_dir=tmp_path / "w", **{**SMALL, "max_steps": 30})  # type: ignore[arg-type]
    asyncio.run(tune(layout, other))  # other settings: trained anew on the same traces
    assert calls == [1, 1]  # the token horizon, then the layer horizon


def test_a_phase_found_done_says_so_once(capsys: pytest.CaptureFixture[str]) -> None:
    from edge0.cli.tune import Bars

    bars = Bars()
    bars.tty = False  # the lines, as under nohup or a scheduler
    bars.update("traces (train)", 512, 512)  # resumed with every window on disk
    bars.update("traces (train)", 512, 512)
    bars.update("heads (layer horizon)", 0, 1)
    bars.update("heads (layer horizon)", 1, 1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("tune: traces (train) 512/512 tok") and len(lines) == 3
    assert lines[1:] == ["tune: heads (layer horizon) started", lines[2]]
    assert lines[2].startswith("tune: heads (layer horizon) done in ")


def test_validation_rows_on_disk_equal_the_decoded_rows(layout: Path, tmp_path: Path) -> None:
    """The validation writes each decoded row to a file (a 248k vocabulary's rows do not fit
    the budget); the file holds what forced decoding returns, and the agreement computed a
    few rows at a time is the one computed at once."""
    from edge0.eval.policy import forced_decode
    from edge0.layout.artifacts import record_artifacts
    from edge0.routing.prerouter import PrerouterSet
    from edge0.runtime.engine.api import Engine
    from edge0.tune.validate import agreement, decode_logits

    PrerouterSet.from_model(load_layout(layout, experts="resident").model).save(layout)
    record_artifacts(layout)  # heads in the layout, as tune leaves them before validating
    windows = np.random.default_rng(0).integers(0, 100, (2, 12))
    engine = {"tiers": "pread", "mode": "hint", "predictor": "heads"}

    async def stacked() -> np.ndarray:
        async with Engine.open(layout, **engine) as eng:
            rows = [(await forced_decode(eng, list(map(int, w)), 4))[0] for w in windows]
        return np.concatenate(rows)

    want = asyncio.run(stacked())
    got = asyncio.run(decode_logits(layout, "hint", windows, 4, {"tiers": "pread"}, tmp_path / "x"))
    assert isinstance(got, np.memmap) and got.shape == want.shape == (14, want.shape[1])
    np.testing.assert_array_equal(np.asarray(got), want)
    other = want + np.random.default_rng(1).normal(0, 2, want.shape).astype(np.float32)
    whole = agreement(want, other, chunk=len(want))
    assert agreement(got, other, chunk=3) == pytest.approx(whole, rel=1e-12)
    assert agreement(got, got) == {"agreement": 1.0, "kl_mean": 0.0, "kl_p99": 0.0, "tokens": 14}


def test_heads_that_recall_less_than_the_untrained_rule_are_not_kept(
    layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge0.tune import pipeline

    real = pipeline.head_recall

    def worse_when_trained(heads: Any, *args: Any) -> dict[str, Any]:
        out = real(heads, *args)
        return {**out, "recall": 0.0} if heads.config.trained else out

    monkeypatch.setattr(pipeline, "head_recall", worse_when_trained)
    args = ["tune", str(layout), "--work-dir", str(tmp_path / "w"), "--tiers", "pread"]
    args += ["--tokens", "512", "--heldout-tokens", "256", "--seq-len", "32"]
    res = CliRunner().invoke(main, [*args, "--max-minutes", "0.2"])
    assert res.exit_code == 0, res.output
    assert "below the untrained rule, which stays" in res.output  # the layer horizon
    assert "kept the rule and wrote no heads" in res.output  # the token horizon
    assert not any((layout / n).exists() for n in ("prerouter.json", "prerouter-layer.json"))
    assert Validation.read(layout) is None  # exact stays the default
