"""Pipeline parallel over real local ranks (mlx.distributed ring on 127.0.0.1): tokens equal to
one process in every mode; a rank that dies or hangs ends the request with a clear error."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import build_store

from edge0.layout.manifest import Manifest
from edge0.model.generate import SamplingSettings
from edge0.ranks.hosts import parse_hosts
from edge0.runtime.engine.api import Engine
from edge0.runtime.io.slots import pool_size

DRIVER = Path(__file__).parent / "dist_driver.py"
PROMPTS = [[5, 17, 42, 7, 99], [3, 1, 4, 1, 5, 9]]
MODES = ("resident", "reactive", "hint", "route")


def start(path: Path, **options: Any) -> subprocess.Popen[str]:
    """The driver (rank 0, which spawns the other ranks) in its own process."""
    options.setdefault("prompts", PROMPTS)
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(path), json.dumps(options)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return got


def single(
    path: Path, max_tokens: int = 8, sampling: dict[str, Any] | None = None, **options: Any
) -> list[list[int]]:
    settings = SamplingSettings(**(sampling or {}))

    async def go() -> list[list[int]]:
        async with Engine.open(path, **options) as eng:
            return [
                [
                    t
                    async for t in eng.tokens(
                        ids, max_tokens=max_tokens, sampling=settings, stop=False
                    )
                ]
                for ids in PROMPTS
            ]

    return asyncio.run(go())


def mode_options(mode: str) -> dict[str, Any]:
    return dict(mode=mode, tiers="pread", predictor="init" if mode in ("hint", "route") else None)


@pytest.fixture(scope="module")
def hybrid4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """qwen3_5_moe, 4 layers: Gated DeltaNet + full attention + shared expert."""
    return build_store(tmp_path_factory.mktemp("dist"), "qwen3_5_moe")


SEEDED = dict(temp=0.9, seed=7)  # the last rank draws, with the same seeded sampler


def test_two_ranks_match_one_process_in_every_mode(hybrid4: Path) -> None:
    runs = {m: mode_options(m) for m in MODES}
    runs["route, sampled"] = dict(mode_options("route"), sampling=SEEDED)
    procs = {name: start(hybrid4, hosts=2, rank_timeout=60, **o) for name, o in runs.items()}
    want = {name: single(hybrid4, **o) for name, o in runs.items()}  # meanwhile, here
    assert want["route, sampled"] != want["route"]  # the sampler matters
    for mode, proc in procs.items():
        got = result(proc)
        assert got["tokens"] == want[mode], mode
        stats = got["stats"]
        assert [int(s["rank"]) for s in stats] == [0, 1]
        assert all(s["steps"] == len(PROMPTS[1]) + 7 for s in stats)  # the last request's steps
        if mode != "resident":  # each rank read only its own layers' experts (rank 0 keeps layer 0)
            assert stats[0]["reads"] > 0 and stats[1]["reads"] > 0, mode
            assert_own_reads(got)


def assert_own_reads(got: dict[str, Any]) -> None:
    """Every rank read experts, and only those of its own layers."""
    for s, (a, b) in zip(got["stats"], got["split"], strict=True):
        assert s["reads"] > 0 and a <= s["read_layer_min"] <= s["read_layer_max"] < b, (s, a, b)


def test_two_ranks_under_a_per_rank_memory_budget_match_one_process(hybrid4: Path) -> None:
    opts = mode_options("route")
    proc = start(hybrid4, hosts=2, rank_timeout=60, memory_budget="2GiB", **opts)
    want = single(hybrid4, **opts)
    got = result(proc)
    assert got["tokens"] == want
    assert got["plan"].startswith("memory budget 2048 MiB") and "more slots" in got["plan"]
    manifest = Manifest.load(hybrid4)
    k = int((manifest.config.get("text_config") or manifest.config)["num_experts_per_tok"])
    for s, (a, b) in zip(got["stats"], got["split"], strict=True):
        # the rank's own streamed layers (layer 0's experts stay on rank 0): at least its
        # plan's minimum pool (the budget's rest buys more, up to its own records), and any
        # read is of its own layers
        streamed = [i for i in manifest.moe_layers[1:] if a <= i < b]
        assert s["slots"] >= pool_size(k, len(streamed)), (s, a, b)
        assert not s["reads"] or a <= s["read_layer_min"] <= s["read_layer_max"] < b, (s, a, b)


@pytest.mark.slow
def test_four_ranks_match_one_process_route_wrap(tmp_path: Path) -> None:
    """8 layers over 4 ranks; the last rank's wrap-around head predicts rank 0's first layer."""
    path = build_store(tmp_path, "qwen3_5_moe", layers=8)
    opts = dict(mode="route", tiers="pread", predictor="init", first_layer="wrap")
    proc = start(
        path,
        hosts="127.0.0.1,127.0.0.1,127.0.0.1,127.0.0.1",
        layers="2,2,2,2",
        rank_timeout=60,
        **opts,
    )
    want = single(path, **opts)
    got = result(proc)
    assert got["tokens"] == want
    assert [int(s["rank"]) for s in got["stats"]] == [0, 1, 2, 3]


def test_rank_that_dies_hangs_or_cannot_start_ends_the_request(hybrid4: Path) -> None:
    common = dict(hosts=2, tiers="pread", max_tokens=50, prompts=PROMPTS[:1])
    bad_start = start(hybrid4, mode="reactive", bad_rank_path=True, **common)
    dies = start(
        hybrid4, mode="route", rank_timeout=30, fault={"after": 3, "signal": "KILL"}, **common
    )
    hangs = start(
        hybrid4, mode="reactive", rank_timeout=3, fault={"after": 2, "signal": "STOP"}, **common
    )
    got = result(dies)
    assert got["type"] == "RankError", got
    assert "a rank died" in got["error"] and len(got["partial"]) == 3, got
    assert got["seconds"] < 20, got  # the lost connection, well before the 30 s timeout
    assert "a rank died" in got["again"] and got["again_seconds"] < 1, got  # fails fast after
    got = result(hangs)
    assert got["type"] == "RankError", got
    assert "no answer within 3 s" in got["error"] and len(got["partial"]) == 2, got
    assert 2.5 < got["seconds"] < 20, got
    assert "no answer" in got["again"] and got["again_seconds"] < 1, got
    got = result(bad_start)
    assert got["type"] == "RankError", got
    assert "rank 1 exited with code 2" in got["error"], got
    assert "/nonexistent/model/edge0.json not found" in got["error"], got


@pytest.mark.slow
def test_cli_hosts_and_mlx_launch_print_the_same_text(hybrid4: Path) -> None:
    """`edge0 run --hosts 2` and `mlx.launch -n 2 ... -m edge0 run` vs one process."""
    edge0 = [
        sys.executable,
        "-m",
        "edge0",
        "run",
        str(hybrid4),
        "-p",
        "def f(x):",
        "--max-tokens",
        "12",
        "--mode",
        "route",
        "--predictor",
        "init",
        "--tiers",
        "pread",
    ]
    launch = [
        str(Path(sys.executable).parent / "mlx.launch"),
        "--hosts",
        "127.0.0.1",
        "-n",
        "2",
        "--starting-port",
        str(parse_hosts(2).ports[0]),
        "--python",
        sys.executable,
        "--",
        *edge0[1:],
    ]
    runs = {
        name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, cmd in (("hosts", [*edge0, "--hosts", "2"]), ("launch", launch))
    }
    want = subprocess.run(edge0, capture_output=True, text=True, timeout=120)
    assert want.returncode == 0, want.stderr[-2000:]
    assert want.stdout.strip()
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, (name, err[-2000:])
        assert out == want.stdout, name
        assert "decode:" in err, name  # rank 0's stats line


WINDOWED = ["gpt_oss-sliding", "llama4-layers"]


@pytest.fixture(scope="module")
def windowed_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[list[list[int]], Any]]:
    """Each selected windowed fixture converted, its two ranks started, the pipelines side by
    side; per fixture: one process's tokens and the pipeline's result."""
    from edge0.layout.convert import ConvertOptions, convert
    from edge0.synth.tiny_families import fixture_file, write_family

    chosen = [
        i.callspec.params["fixture"]
        for i in request.session.items
        if i.module is request.module
        and i.originalname == "test_windowed_and_chunked_layers_keep_their_caches_across_ranks"
    ]
    opts = mode_options("reactive")
    paths, procs = {}, {}
    for name in chosen:
        tmp = tmp_path_factory.mktemp(name)
        hf = write_family(fixture_file(Path(__file__).parent / "fixtures", name), tmp / "hf")
        paths[name] = tmp / "e0"
        convert(hf, paths[name], ConvertOptions(group_size=32))
        procs[name] = start(paths[name], hosts=2, rank_timeout=60, max_tokens=8, **opts)
    wants = {name: single(path, **opts) for name, path in paths.items()}  # meanwhile, here
    got: dict[str, tuple[list[list[int]], Any]] = {}
    for name, proc in procs.items():
        try:
            got[name] = wants[name], result(proc)
        except AssertionError as exc:  # a pipeline that failed fails its own test
            got[name] = wants[name], exc
    return got


@pytest.mark.parametrize("fixture", WINDOWED)
def test_windowed_and_chunked_layers_keep_their_caches_across_ranks(
    windowed_runs: dict[str, tuple[list[list[int]], Any]], fixture: str
) -> None:
    """A rank's sliding-window (gpt-oss) and chunked (Llama 4) attention layers keep the caches
    one process gives them: windows and chunks of 4 tokens, prompts and outputs past them."""
    want, got = windowed_runs[fixture]
    if isinstance(got, AssertionError):
        raise got
    assert got["tokens"] == want
