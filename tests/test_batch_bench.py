"""`edge0 bench batch`: the full-batch step figures, the calibrated throttle, the CLI table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from runtime_helpers import build_store

from edge0.bench.batch import calibrated_throttle, run_bench
from edge0.cli.main import main


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("batch-bench"), "qwen3_5_moe", experts=16)


def test_every_variant_measures_full_batch_steps(store: Path) -> None:
    res = run_bench(store, ["reactive"], [1, 3], ["pread"], None, None, 4, 4, 1)
    rows = {(r["mode"], r["batch"]): r for r in res["rows"]}
    assert set(rows) == {("reactive", 1), ("reactive", 3)}
    one, three = rows[("reactive", 1)], rows[("reactive", 3)]
    assert one["x_batch1"] == 1.0 and three["x_batch1"] > 0
    assert one["agg_tps"] == pytest.approx(one["per_request_tps"])  # one token a step
    assert three["agg_tps"] == pytest.approx(3 * three["per_request_tps"])
    assert one["mib_per_token"] > 0 and res["calibration"] is None


def test_the_throttle_makes_reads_take_io_ratio_times_compute() -> None:
    page = {"mib_per_token": 2.0, "compute_ms_per_step": 100.0}
    # 2 MiB in 0.1 s x 2 = 0.2 s -> 10.49 MB/s
    assert calibrated_throttle(page, 2.0) == "throttle:bw=10.5MB/s,lat=100us>pread"


def test_cli_prints_the_table_and_writes_json(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    r = CliRunner().invoke(
        main,
        [
            "bench",
            "batch",
            str(store),
            "--modes",
            "route",
            "--batches",
            "1,2",
            "--tokens",
            "3",
            "--prompt-len",
            "3",
            "--same-prompt",
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "| pread | route | 2 |" in r.output
    got = json.loads(out.read_text())
    assert [row["batch"] for row in got["rows"]] == [1, 2] and got["same_prompt"]
    one, two = got["rows"]
    assert two["mib_per_token"] <= one["mib_per_token"]  # the same experts, read once for two
    bad = CliRunner().invoke(main, ["bench", "batch", str(store), "--batches", "0,2"])
    assert bad.exit_code == 2 and "--batches must be positive integers" in bad.output
