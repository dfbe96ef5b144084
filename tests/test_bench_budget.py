"""`edge0 bench budget`: each budget's run inside a memory cgroup of that size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge0.bench import budget, cgroup
from edge0.cli.main import main
from edge0.errors import ConfigError

_MIB = 1 << 20


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]  # the session's read-only store (conftest.py)


def test_budgets_parse_sorted_and_once() -> None:
    assert budget.parse_budgets("3GiB, 512MiB,3GiB,") == [512 * _MIB, 3 << 30]
    with pytest.raises(ConfigError, match="'lots' is not a size"):
        budget.parse_budgets("1GiB,lots")
    with pytest.raises(ConfigError, match="one size or more"):
        budget.parse_budgets(" , ")


def test_no_memory_cgroup_is_one_line_and_runs_nothing(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroup, "V1", tmp_path / "v1")  # neither hierarchy exists here
    monkeypatch.setattr(cgroup, "V2_ROOTS", (tmp_path / "v2",))
    ran: list[int] = []
    monkeypatch.setattr(budget, "sweep", lambda *a, **k: ran.append(1))
    res = CliRunner().invoke(main, ["bench", "budget", str(store), "--budgets", "1GiB"])
    assert res.exit_code == 2 and not ran
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "needs a memory cgroup: no cgroup memory controller" in lines[0]


def test_each_budget_runs_in_its_own_cgroup(store: Path, tmp_path: Path) -> None:
    try:
        budget.check_cgroups()
    except (cgroup.CapError, OSError) as exc:
        pytest.skip(f"no usable memory cgroup here: {exc}")
    out = tmp_path / "b.json"
    args = ["bench", "budget", str(store), "--budgets", "768MiB,1GiB", "--tokens", "3"]
    res = CliRunner().invoke(main, [*args, "--prompts", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["budget_bytes"] for r in rows] == [768 * _MIB, 1 << 30]
    for r in rows:
        assert r["exit"] == 0 and not r["errors"] and r["decode_tps"] > 0
        assert r["cgroup_limit_bytes"] == r["budget_bytes"]  # the cap was the budget
        assert 0 < r["cgroup_peak_bytes"] <= r["budget_bytes"]
        assert r["peak_rss_bytes"] > 0
        assert r["memory_plans"][0].startswith(f"memory budget {r['budget_bytes'] >> 20} MiB")
    assert "| 0.75 GiB |" in res.output and "| 1.00 GiB |" in res.output


def test_the_plot_leaves_out_runs_without_a_figure(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from edge0.bench.plot import budget_plot

    rows = [{"budget_bytes": b << 30, "decode_tps": t} for b, t in ((2, None), (3, 1.5), (6, 2.0))]
    assert budget_plot(rows, tmp_path / "b.png").stat().st_size > 0


def test_without_llama_cpp_a_gguf_is_refused_in_one_line(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # not installed: import fails
    monkeypatch.setattr(budget, "check_cgroups", lambda: None)
    ran: list[int] = []
    monkeypatch.setattr(budget, "sweep", lambda *a, **k: ran.append(1))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    res = CliRunner().invoke(
        main, ["bench", "budget", str(store), "--budgets", "1GiB", "--gguf", str(gguf)]
    )
    assert res.exit_code == 2 and not ran
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "llama-cpp-python is not installed" in lines[0]


def test_the_table_sets_llama_cpp_beside_each_budget() -> None:
    base = {
        "exit": 0,
        "compute_ms_per_step": 300.0,
        "blocked_ms_per_step": 8.0,
        "bytes_per_token": 240 * _MIB,
        "cgroup_peak_bytes": 2 << 30,
        "peak_rss_bytes": 2 << 30,
        "limit_hits": 0,
        "oom_kills": 0,
    }
    rows = [
        {**base, "budget_bytes": 3 << 30, "decode_tps": 3.0, "llama_cpp": {"decode_tps": 0.12}},
        {**base, "budget_bytes": 6 << 30, "decode_tps": 3.3, "llama_cpp": {"decode_tps": None}},
    ]
    text = budget.table(rows)
    assert "llama.cpp tok/s | Edge0 / llama.cpp |" in text.splitlines()[0]
    assert text.splitlines()[2].endswith("| 0.120 | 25.00 |")
    assert text.splitlines()[3].endswith("| - | - |")  # llama.cpp gave no figure there
    plain = budget.table([{**base, "budget_bytes": 1 << 30, "decode_tps": 1.0}])
    assert "llama.cpp" not in plain  # no peer ran: no columns for it


def test_llama_cpp_in_a_cap_keeps_its_weights_in_the_file_mapping(tmp_path: Path) -> None:
    from edge0.bench.llama_peer import Peer

    gguf = tmp_path / "m.gguf"
    assert "--no-repack" in Peer(gguf, 1, repack=False).command(tmp_path / "o.json", 16, 4, 1)
    assert "--no-repack" not in Peer(gguf, 1).command(tmp_path / "o.json", 16, 4, 1)


def test_repacking_off_reaches_llama_cpp_model_params() -> None:
    api = pytest.importorskip("llama_cpp.llama_cpp")
    from edge0.bench.llama_peer import _repacking

    default = api.llama_model_default_params
    with _repacking(False):
        assert api.llama_model_default_params().use_extra_bufts is False
    assert api.llama_model_default_params is default
    assert default().use_extra_bufts is True


def test_each_run_starts_with_its_files_out_of_the_page_cache(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    for name in ("edge0.json", "experts.bin"):
        (tmp_path / "model" / name).write_bytes(b"x" * 8192)
    files = budget.model_files(str(tmp_path / "model"))
    assert [p.name for p in files] == ["edge0.json", "experts.bin"]
    assert budget.model_files("org/hub-model") == []  # a hub id: nothing local to evict
    budget.evict([*files, tmp_path / "missing.gguf"])  # a missing file is passed over
