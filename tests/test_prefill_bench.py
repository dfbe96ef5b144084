"""`edge0 bench run --prefill-chunk`: chunked vs one-token variants, prefill ratios, fewer reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge0.cli.main import main


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]  # the session's read-only store (conftest.py)


def test_bench_compares_chunked_with_one_token_prefill(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = [
        "bench",
        "run",
        str(store),
        "--modes",
        "reactive",
        "--prefill-chunk",
        "1,12",
        "--prompt-len",
        "12",
        "--prompts",
        "1",
        "--tokens",
        "2",
        "--repeats",
        "2",
        "--warmup-tokens",
        "1",
        "--isolate",
        "process",
        "--json",
        str(out),
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    rows = {v["prefill_chunk"]: v for v in rep["variants"]}
    assert set(rows) == {1, 12} and all(r["runs_ok"] == 2 for r in rows.values())
    one, chunked = rows[1]["median"], rows[12]["median"]
    assert one["prefill_tps"] > 0 and chunked["prefill_tps"] > 0
    # one forward for the 12 prompt tokens: each expert of the union read once, not per token
    assert 0 < chunked["prefill_bytes_per_token"] < one["prefill_bytes_per_token"]
    (ratio,) = rep["prefill_ratios"]
    assert ratio["variant"].endswith("chunk=12 @ ram:1GiB>pread")
    assert ratio["over"].endswith("chunk=1 @ ram:1GiB>pread") and len(ratio["per_round"]) == 2
    assert "x prefill tok/s" in res.output and "prefill MiB/prompt tok" in res.output


def test_bench_rejects_a_bad_chunk_list(store: Path) -> None:
    res = CliRunner().invoke(main, ["bench", "run", str(store), "--prefill-chunk", "1,x"])
    assert res.exit_code == 2 and "--prefill-chunk (prefill_chunk=) takes an integer" in res.output
    res = CliRunner().invoke(main, ["bench", "run", str(store), "--prefill-chunk", "0"])
    assert res.exit_code == 2 and "at least 1" in res.output


def test_run_rejects_a_zero_chunk(store: Path) -> None:
    res = CliRunner().invoke(main, ["run", str(store), "-p", "hi", "--prefill-chunk", "0"])
    assert res.exit_code == 2 and "--prefill-chunk" in res.output


def test_run_prints_the_prefill_line(store: Path) -> None:
    args = [
        "run",
        str(store),
        "-p",
        "hello there world",
        "--no-chat",
        "--max-tokens",
        "2",
        "--mode",
        "reactive",
        "--prefill-chunk",
        "2",
        "--stats",
        "full",
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "prefill: chunk 2, reads " in res.output and "first decode step blocked" in res.output
