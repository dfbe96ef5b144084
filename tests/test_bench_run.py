"""`edge0 bench run` / `sweep`: variant grid, interleaving, table and JSON structure, plots."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge0.bench import run as bench_run
from edge0.bench import sweep as bench_sweep
from edge0.bench.run import BenchOptions, Variant
from edge0.cli.main import main
from edge0.errors import ConfigError

FIELDS = {
    "decode_tps",
    "prefill_tps",
    "blocked_ms_per_step",
    "bytes_per_token",
    "slot_hit_rate",
    "cache_hit_rate",
    "overlap_efficiency",
    "peak_mlx_bytes",
    "peak_rss_bytes",
    "gen_peak_rss_bytes",
    "read_bytes_per_s",
}


@pytest.fixture(scope="module")
def store(runtime_stores: dict[str, Path]) -> Path:
    return runtime_stores["qwen3_moe"]  # the session's read-only store (conftest.py)


def _opts(store: Path, **kw: object) -> BenchOptions:
    base: dict = dict(
        prompts=1, prompt_len=4, tokens=3, repeats=2, warmup_tokens=1, isolate="process"
    )
    base.update(kw)
    return BenchOptions(model=store, **base)


def test_variant_grid() -> None:
    vs = bench_run.make_variants(["resident", "reactive", "route"], [2, 4], ["pread", "mmap"])
    labels = [v.label for v in vs]
    assert len(vs) == 2 + 2 * 2 * 2  # resident once per K: it reads nothing
    assert labels[0] == "resident K=2 @ -" and "route (init) K=4 @ mmap" in labels
    assert len(set(labels)) == len(labels)
    with pytest.raises(ConfigError, match="unknown mode"):
        bench_run.make_variants(["fast"], [None], ["pread"])
    # predictors: one variant each for hint and route (before and after `edge0 tune`)
    vs = bench_run.make_variants(["reactive", "hint", "route"], [2], ["pread"], ["init", "heads"])
    assert [v.label for v in vs] == [
        "reactive K=2 @ pread",
        "hint (init) K=2 @ pread",
        "hint (heads) K=2 @ pread",
        "route (init) K=2 @ pread",
        "route (heads) K=2 @ pread",
    ]


def test_rounds_interleave_and_report(store: Path) -> None:
    variants = [Variant("reactive", 2, "pread"), Variant("route", 2, "pread")]
    seen: list[tuple[int, str]] = []
    runs = bench_run.run_rounds(variants, _opts(store), lambda r, v, _: seen.append((r, v.label)))
    a, b = (v.label for v in variants)
    assert seen == [(0, a), (0, b), (1, a), (1, b)]  # A B A B
    rep = bench_run.report(variants, _opts(store), runs, "edge0 bench run x")
    assert [o["label"] for o in rep["order"]] == [a, b, a, b]
    assert [o["round"] for o in rep["order"]] == [0, 0, 1, 1]
    for row in rep["variants"]:
        assert row["runs_ok"] == 2 and not row["errors"]
        assert FIELDS <= set(row["median"]) and FIELDS <= set(row["min"])
        assert row["min"]["decode_tps"] <= row["median"]["decode_tps"] <= row["max"]["decode_tps"]
        for run in row["runs"]:
            assert run["rss_method"] == "clear_refs" and run["summary"]["generated_tokens"] == 3
            assert len(run["stats"]) == 1 and run["stats"][0]["mode"] == row["mode"]
    assert rep["variants"][0]["median"]["bytes_per_token"] > 0  # reactive reads experts
    (ratio,) = rep["ratios"]
    assert ratio["variant"] == b and ratio["over"] == a and len(ratio["per_round"]) == 2
    lines = rep["table"].splitlines()
    assert len(lines) == 4 and lines[0].count("|") == lines[2].count("|") == lines[3].count("|")
    assert lines[2].startswith(f"| {a} | 2 | ") and lines[3].startswith(f"| {b} | 2 | ")
    json.dumps(rep)  # serialisable as written by --json


def test_failed_variant_is_reported_not_fatal(store: Path) -> None:
    variants = [Variant("reactive", 2, "nosuchtier"), Variant("resident", 2, "pread")]
    runs = bench_run.run_rounds(variants, _opts(store, repeats=1))
    rep = bench_run.report(variants, _opts(store, repeats=1), runs)
    bad, good = rep["variants"]
    assert bad["runs_ok"] == 0 and "nosuchtier" in bad["errors"][0]
    assert good["runs_ok"] == 1
    assert "| 0 | failed:" in rep["table"]


def test_subprocess_run_has_its_own_peak_rss(store: Path) -> None:
    job = bench_run.make_job(Variant("reactive", 2, "pread"), _opts(store), 0)
    res = bench_run.run_subprocess(job, timeout_s=300, mem_floor=0)
    assert res["error"] is None and res["rss_method"] == "subprocess"
    assert res["summary"]["peak_rss_bytes"] >= res["rss_before_bytes"] > 0
    assert res["rss_polled_max_bytes"] > 0


def test_subprocess_timeout_is_reported(store: Path) -> None:
    job = bench_run.make_job(Variant("reactive", 2, "pread"), _opts(store), 0)
    res = bench_run.run_subprocess(job, timeout_s=0.05, mem_floor=0)
    assert "timeout" in res["error"] and "summary" not in res


def test_sweep_cli_json_and_table(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    args = [
        "bench",
        "sweep",
        str(store),
        "--bandwidths",
        "0.5,2",
        "--k",
        "2",
        "--repeats",
        "1",
        "--prompts",
        "1",
        "--prompt-len",
        "3",
        "--tokens",
        "2",
        "--warmup-tokens",
        "0",
        "--isolate",
        "process",
        "--json",
        str(out),
        "--md",
        str(tmp_path / "s.md"),
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    labels = [v["label"] for v in rep["variants"]]
    assert labels == [
        "reactive K=2 @ throttle:bw=0.5GB/s,lat=100us>pread",
        "route (init) K=2 @ throttle:bw=0.5GB/s,lat=100us>pread",
        "reactive K=2 @ throttle:bw=2GB/s,lat=100us>pread",
        "route (init) K=2 @ throttle:bw=2GB/s,lat=100us>pread",
        "resident K=2 @ -",
    ]
    assert sorted(p[0] for p in rep["sweep"]["points"]["route"]) == [0.5, 2]
    assert len(rep["sweep"]["bounds"]) == 1
    table = [ln for ln in res.output.splitlines() if ln.startswith("| ")]
    assert table[0].startswith("| GB/s | reactive tok/s | route tok/s |")
    assert [ln.split(" | ")[0] for ln in table[1:]] == ["| 0.5", "| 2"]
    assert "edge0 bench sweep" in (tmp_path / "s.md").read_text()


def test_sweep_rejects_bad_input() -> None:
    with pytest.raises(ConfigError):
        bench_sweep.parse_bandwidths("fast")
    with pytest.raises(ConfigError, match="unknown bound"):
        bench_sweep.Sweep((1.0,), ("route",), 2, bounds=("oracle",)).variants()


def test_plots_write_pngs(store: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from edge0.bench import plot as bench_plot

    trace = tmp_path / "t.json"
    job = bench_run.make_job(Variant("route", 2, "pread"), _opts(store), 0, trace=str(trace))
    assert bench_run.run_one(job, _opts(store))["error"] is None
    png = bench_plot.timeline({"route": trace}, tmp_path / "timeline.png", steps=2)
    assert png.read_bytes()[:4] == b"\x89PNG"
    variants = [Variant("reactive", 2, "pread")]
    rep = bench_run.report(variants, _opts(store), bench_run.run_rounds(variants, _opts(store)))
    assert bench_plot.bars(rep, tmp_path / "bars.png").read_bytes()[:4] == b"\x89PNG"
    pts = {"route": [(0.5, 2.0, 1.5, 2.5), (1.0, 3.0, 2.9, 3.1)]}
    out = bench_plot.sweep_plot(pts, {"resident": 4.0}, tmp_path / "s.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from edge0.bench import plot as bench_plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match="matplotlib"):
        bench_plot.sweep_plot({}, {}, Path("never.png"))


def test_sync_every_grid_and_ratios_over_the_first_value() -> None:
    vs = bench_run.make_variants(["reactive", "route"], [2], ["pread"], sync_every=[4, 1])
    assert [v.label for v in vs] == [
        "reactive K=2 @ pread",
        "route (init) K=2 sync=4 @ pread",
        "route (init) K=2 sync=1 @ pread",
    ]  # route once per value; the other modes once (they sync per layer anyway)
    g4, g1 = vs[1], vs[2]

    def runs(tps: list[float], blocked: list[float]) -> list[dict]:
        return [
            {"summary": {"decode_tps": t, "blocked_ms_per_step": b}}
            for t, b in zip(tps, blocked, strict=True)
        ]

    got = bench_run.sync_ratios(
        vs, {g4.label: runs([2.0, 4.0], [10.0, 10.0]), g1.label: runs([1.0, 4.0], [20.0, 5.0])}
    )
    tps, blocked = got
    assert tps["variant"] == g1.label and tps["over"] == g4.label
    assert tps["per_round"] == [0.5, 1.0] and blocked["per_round"] == [2.0, 0.5]
    assert "blocked ms/step" in bench_run.ratio_lines(got)


def test_sync_every_reaches_the_engine(store: Path) -> None:
    variants = bench_run.make_variants(["route"], [2], ["pread"], sync_every=[1, 8])
    runs = bench_run.run_rounds(variants, _opts(store, repeats=1))
    rep = bench_run.report(variants, _opts(store, repeats=1), runs)
    per_layer, grouped = (v["median"]["syncs_per_token"] for v in rep["variants"])
    assert per_layer > grouped >= 1  # one sync per layer against one per group of 8
    assert rep["variants"][0]["runs"][0]["stats"][0]["generated_tokens"] == 3


def test_sync_every_cli_rejects_bad_values(store: Path) -> None:
    for bad in ("0", "fast", "2,2"):
        res = CliRunner().invoke(main, ["bench", "run", str(store), "--sync-every", bad])
        assert res.exit_code != 0 and "--sync-every" in res.output


def test_kernel_choices_set_the_environment_and_unknown_ones_are_refused(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge0.bench.worker import use_kernels
    from edge0.kernels import native

    res = CliRunner().invoke(main, ["bench", "run", str(store), "--kernels", "native,fast"])
    assert res.exit_code == 2
    assert "unknown kernels 'fast'" in res.output and "native-int8" in res.output
    want = {"native-int8": ("1", "1"), "native": ("1", "0"), "mlx": ("0", "0")}
    for name, (on, int8) in want.items():
        monkeypatch.setenv("EDGE0_INT8_ACTIVATIONS", "1")  # the variant's choice wins
        monkeypatch.setenv("EDGE0_NATIVE_KERNELS", "1")
        use_kernels(name)
        got = (os.environ["EDGE0_NATIVE_KERNELS"], os.environ["EDGE0_INT8_ACTIVATIONS"])
        assert got == (on, int8), name
    monkeypatch.delenv("EDGE0_INT8_ACTIVATIONS")
    monkeypatch.delenv("EDGE0_NATIVE_KERNELS")
    native.reset()  # loaded again, from the session's own environment, at the next use


def test_llama_cpp_runs_once_a_round_after_the_variants(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple] = []

    def fake(self: bench_run.Peer, prompt_len: int, tokens: int, prompts: int, t: float):
        calls.append((self.gguf.name, prompt_len, tokens, prompts, self.threads))
        return {"decode_tps": 50.0} if len(calls) == 1 else {"error": "x"}

    monkeypatch.setattr(bench_run.Peer, "decode", fake)
    variants = bench_run.make_variants(["resident"], [None], ["pread"])
    peer = bench_run.Peer(Path("m.gguf"), threads=2)
    runs = bench_run.run_rounds(variants, _opts(store), peer=peer)
    assert calls == [("m.gguf", 4, 3, 1, 2)] * 2  # the variants' prompt shape, each round
    order = sorted((r["seq"], r["label"]) for rs in runs.values() for r in rs)
    assert [lab for _, lab in order] == [variants[0].label, "llama.cpp"] * 2
    got = bench_run.peer_ratios(variants, runs)  # round 2's llama.cpp failed: no ratio there
    mine = runs[variants[0].label][0]["summary"]["decode_tps"]
    assert len(got) == 1 and got[0]["per_round"] == [mine / 50.0]
