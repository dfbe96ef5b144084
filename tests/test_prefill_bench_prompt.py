"""`edge0 bench prefill`: its variants, its ratios, and one small run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from runtime_helpers import build_store

from edge0.bench import prompt
from edge0.cli.main import main


def test_variants_and_their_refusals() -> None:
    got = prompt.parse_variants("native,mlx", "64,1")
    assert [v.name for v in got] == [
        "native chunk=64",
        "native chunk=1",
        "mlx chunk=64",
        "mlx chunk=1",
    ]
    assert [v.name for v in prompt.parse_variants("native", "8", "1,2")] == [
        "native chunk=8 threads=1",
        "native chunk=8 threads=2",
    ]
    plan = prompt.parse_variants("native", "plan,1")
    assert [v.name for v in plan] == ["native chunk=plan", "native chunk=1"]
    assert plan[0].chunk == prompt.PLAN
    for kernels, chunks, threads, why in (
        ("cuda", "64", "", "--kernels"),
        ("native", "0", "", "at least 1"),
        ("native", "plans", "", "--chunks"),
        ("native", "8", "0", "within 1..64"),
        ("native", "8", "two", "--threads"),
    ):
        with pytest.raises(ValueError, match=why):
            prompt.parse_variants(kernels, chunks, threads)


def test_ratios_pair_chunked_with_one_token_and_native_with_mlx() -> None:
    vs = prompt.parse_variants("native,mlx", "64,1")
    run = {"prompt_tps": 0.0, "ttft_s": 0.1, "mib_per_prompt_token": 0.5, "cpu_s": 1.0}
    tps = {
        "native chunk=64": 800.0,
        "native chunk=1": 100.0,
        "mlx chunk=64": 200.0,
        "mlx chunk=1": 50.0,
    }
    rounds = [{n: {"runs": [{**run, "prompt_tps": t, "tokens": [1, 2]}]} for n, t in tps.items()}]
    s = prompt.summarise(vs, rounds)
    got = {(r["variant"], r["over"]): r["median"] for r in s["ratios"]}
    assert got[("native chunk=64", "native chunk=1")] == 8.0
    assert got[("native chunk=64", "mlx chunk=64")] == 4.0
    assert got[("mlx chunk=64", "mlx chunk=1")] == 4.0
    assert "| native chunk=64 | 800 |" in prompt.table(s, 16)


def test_same_tokens_compares_each_prompt_across_rounds() -> None:
    vs = prompt.parse_variants("native", "64")
    run = {"prompt_tps": 1.0, "ttft_s": 0.1, "mib_per_prompt_token": 0.5, "cpu_s": 1.0}

    def rnd(*toks: list[int]) -> dict:
        return {"native chunk=64": {"runs": [{**run, "tokens": t} for t in toks]}}

    same = prompt.summarise(vs, [rnd([1, 2], [3, 4]), rnd([1, 2], [3, 4])])  # two prompts
    assert same["rows"]["native chunk=64"]["same_tokens_every_round"]
    moved = prompt.summarise(vs, [rnd([1, 2], [3, 4]), rnd([1, 2], [3, 5])])
    assert not moved["rows"]["native chunk=64"]["same_tokens_every_round"]


def test_a_small_run_end_to_end(tmp_path: Path) -> None:
    store = build_store(tmp_path, "qwen3_moe")
    out = tmp_path / "bench.json"
    args = ["bench", "prefill", str(store), "--prompt-len", "24", "--prompts", "1", "--tokens", "3"]
    args += ["--rounds", "1", "--kernels", "native", "--chunks", "8,1", "--json", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "native chunk=8 / native chunk=1" in res.output
    assert "llama" in res.output  # the peer's line: figures, or why there are none
    got = json.loads(out.read_text())
    rows = got["summary"]["rows"]
    assert rows["native chunk=8"]["tokens"] == rows["native chunk=1"]["tokens"]  # same greedy
    assert (
        rows["native chunk=8"]["mib_per_prompt_token"]
        < rows["native chunk=1"]["mib_per_prompt_token"]
    )


def test_the_plans_chunk_under_a_budget(tmp_path: Path) -> None:
    """`--chunks plan` runs the memory plan's chunk (reported per run, with the plan line and
    the load average) under the given budget; without a budget it is refused."""
    store = build_store(tmp_path, "qwen3_moe")
    out = tmp_path / "bench.json"
    args = ["bench", "prefill", str(store), "--prompt-len", "24", "--prompts", "1", "--tokens", "2"]
    args += ["--rounds", "1", "--kernels", "native", "--chunks", "plan,8", "--json", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "--chunks plan needs --memory-budget" in res.output
    budget = ["--memory-budget", "2GiB", "--top-k", "2", "--predictor", "init"]
    res = CliRunner().invoke(main, [*args, *budget, "--mode", "route"])
    assert res.exit_code == 0, res.output
    got = json.loads(out.read_text())
    assert got["engine"] == {"memory_budget": "2GiB", "top_k": 2, "predictor": "init"}
    run = got["rounds"][0]["native chunk=plan"]
    assert run["chunk"] == got["summary"]["rows"]["native chunk=plan"]["chunk"] > 8
    assert run["plan"].startswith("memory budget 2048 MiB") and "prompt chunk" in run["plan"]
    assert set(run["load_average"]) == {"before", "after"}
    assert got["rounds"][0]["native chunk=8"]["chunk"] == 8
    rows = got["summary"]["rows"]
    assert rows["native chunk=plan"]["tokens"] == rows["native chunk=8"]["tokens"]
