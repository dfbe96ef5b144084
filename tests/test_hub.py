"""Hub ids through the real `huggingface_hub` code: a hand-built cache offline, and a local
server behind HF_ENDPOINT for download, interruption, resume, revisions, 401 and 404."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_server import Hub, Repo, serve

from edge0.errors import ModelLoadError
from edge0.hub.ids import HubId, parse
from edge0.model.demo import teacher_path
from edge0.synth.tiny import TinySpec, write_checkpoint

PROMPT = ["-p", "def f(x):", "--max-tokens", "4", "--seed", "0"]


def test_ids_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse("Qwen/Qwen3-30B-A3B") == HubId("Qwen/Qwen3-30B-A3B")
    assert parse("org/name@v1.0") == HubId("org/name", "v1.0")
    assert str(parse("org/name@abc")) == "org/name@abc"
    for path in ("./org/name", "/abs/dir", "~/m", "a/b/c", "out/", "demo-int4", "a b/c"):
        assert parse(path) is None, path
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse("org/name") is None  # an existing directory wins
    with pytest.raises(ModelLoadError, match="'--' and '..'"):
        parse("org/na--me")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(TinySpec(model_type="qwen3_moe"), tmp_path_factory.mktemp("hf") / "m")


@pytest.fixture(scope="module")
def tiny_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another checkpoint: a second revision of the same repo."""
    spec = TinySpec(model_type="qwen3_moe", seed=7)
    return write_checkpoint(spec, tmp_path_factory.mktemp("hf") / "m")


@pytest.fixture()
def hub(tiny: Path, tiny_b: Path) -> Iterator[Hub]:
    h = Hub()
    repo = Repo()
    repo.add(tiny_b, ref="v1")
    repo.add(tiny)  # main
    h.repos["org/tiny"] = repo
    h.repos["org/gated"] = Repo(gated=True, token="sesame")
    h.repos["org/gated"].add(tiny)
    server, _ = serve(h)
    yield h
    server.shutdown()
    server.server_close()


# `python -m edge0`, with huggingface_hub's one-second pause before each of its own retries of
# a dropped download (five of them) taken out: the retries and the command's answer stay as they are
NO_RETRY_PAUSE = (
    "import sys, time, types\n"
    "import huggingface_hub.file_download as fd\n"
    "fd.time = types.SimpleNamespace(**{**vars(time), 'sleep': lambda s: None})\n"
    "sys.argv[0] = 'edge0'\n"
    "import edge0.__main__\n"
)


def start(env: dict[str, str], *args: str, retry_pause: bool = True) -> subprocess.Popen[str]:
    full = {**os.environ, **env}
    cmd = [sys.executable, *(["-m", "edge0"] if retry_pause else ["-c", NO_RETRY_PAUSE]), *args]
    return subprocess.Popen(
        cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def edge0(
    env: dict[str, str], *args: str, retry_pause: bool = True
) -> subprocess.CompletedProcess[str]:
    return finish(start(env, *args, retry_pause=retry_pause))


def hub_env(tmp: Path, hub: Hub | None = None, **extra: str) -> dict[str, str]:
    env = {"HF_HOME": str(tmp / "hf"), "EDGE0_CACHE": str(tmp / "e0"), **extra}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    if hub is not None:
        env["HF_ENDPOINT"] = hub.url
    return env


def one_line(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip()
    assert line.startswith("edge0: error: ") and "\n" not in line, res.stderr
    for needle in needles:
        assert needle in line, line
    return line


def test_download_convert_once_then_reuse(hub: Hub, tmp_path: Path) -> None:
    env = hub_env(tmp_path, hub)
    first = edge0(env, "run", "org/tiny", *PROMPT)
    assert first.returncode == 0, first.stderr
    layouts = list((tmp_path / "e0" / "hub" / "org--tiny").iterdir())
    assert len(layouts) == 1 and (layouts[0] / "edge0.json").is_file()
    fetched = [p for m, p, _ in hub.log if m == "GET" and "/resolve/" in p]
    assert any(p.endswith("model.safetensors") for p in fetched)
    assert not any(p.endswith(".md") for p in fetched)
    hub.log.clear()
    again = edge0(env, "run", "org/tiny", *PROMPT)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout  # the same layout, the same greedy tokens
    assert not [p for m, p, _ in hub.log if m == "GET" and "/resolve/" in p]  # nothing fetched
    assert list((tmp_path / "e0" / "hub" / "org--tiny").iterdir()) == layouts


def test_interrupted_download_resumes_and_converts_once(hub: Hub, tmp_path: Path) -> None:
    """The demo teacher (56 MiB: huggingface_hub writes 10 MiB at a time) is cut at 15 MB,
    and the network stays down through huggingface_hub's own retries: the command fails in
    one line, converts nothing, and the next run asks only for the rest."""
    demo = Repo()
    demo.add(teacher_path())
    hub.repos["org/demo"] = demo
    env = hub_env(tmp_path, hub)
    hub.cut_after["model.safetensors"] = 15_000_000
    hub.refuse_resumes["model.safetensors"] = 100  # the network stays down for this process
    cut = edge0(env, "run", "org/demo", *PROMPT, retry_pause=False)
    assert hub.refuse_resumes.pop("model.safetensors") < 100  # its own retries came and failed
    one_line(cut, "org/demo", "interrupted", "run the same command again")
    assert not (tmp_path / "e0" / "hub").exists() or not any(
        (tmp_path / "e0" / "hub").rglob("edge0.json")
    )  # a partial download is never converted
    hub.log.clear()
    done = edge0(env, "run", "org/demo", *PROMPT)
    assert done.returncode == 0, done.stderr
    ranges = [r for m, p, r in hub.log if m == "GET" and p.endswith("/model.safetensors")]
    assert len(ranges) == 1 and ranges[0] is not None, ranges  # one request, for the rest
    assert 10 << 20 <= int(ranges[0][6:].rstrip("-")) <= 15_000_000, ranges
    assert len(list((tmp_path / "e0" / "hub").rglob("edge0.json"))) == 1


def test_revision_pinning(hub: Hub, tmp_path: Path) -> None:
    env = hub_env(tmp_path, hub)
    v1 = hub.repos["org/tiny"].refs["v1"]
    nope = start(env, "run", "org/tiny@nope", *PROMPT)  # refused before any download: beside
    pinned = edge0(env, "run", f"org/tiny@{v1}", *PROMPT)  # a commit
    tagged = edge0(env, "run", "org/tiny@v1", *PROMPT)  # the tag that names it
    assert pinned.returncode == tagged.returncode == 0, pinned.stderr + tagged.stderr
    assert pinned.stdout == tagged.stdout
    one_line(finish(nope), "org/tiny@nope", "no revision 'nope'")
    layouts = [p.parent.name for p in (tmp_path / "e0" / "hub").rglob("edge0.json")]
    assert layouts == [layouts[0]] and layouts[0].startswith(v1[:12])  # converted once, for v1


def test_unknown_gated_and_token(hub: Hub, tmp_path: Path) -> None:
    env = hub_env(tmp_path, hub)
    missing, gated = (
        start(env, "run", "org/missing", *PROMPT),
        start(env, "run", "org/gated", *PROMPT),
    )
    one_line(finish(missing), "org/missing", "no such model")  # the two refusals side by side
    one_line(finish(gated), "org/gated is gated", "HF_TOKEN")
    ok = edge0({**env, "HF_TOKEN": "sesame"}, "run", "org/gated", *PROMPT)
    assert ok.returncode == 0, ok.stderr


def test_network_down_and_offline(hub: Hub, tmp_path: Path) -> None:
    down = hub_env(tmp_path, None, HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens there
    off = hub_env(tmp_path, hub, HF_HUB_OFFLINE="1")
    runs = [start(down, "run", "org/tiny", *PROMPT), start(off, "run", "org/tiny", *PROMPT)]
    one_line(finish(runs[0]), "org/tiny", "cannot be reached")  # side by side: neither writes
    one_line(finish(runs[1]), "org/tiny", "HF_HUB_OFFLINE")


def test_offline_run_from_a_hand_built_cache(tiny: Path, tmp_path: Path) -> None:
    """The cache layout huggingface_hub reads: models--ORG--NAME/{refs/main, snapshots/SHA/}."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--org--cached"
    snap = repo / "snapshots" / sha
    snap.mkdir(parents=True)
    for f in tiny.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    env = hub_env(tmp_path, None, HF_HUB_OFFLINE="1")
    runs = [  # side by side: both only read the hand-built cache
        start(env, "run", "org/cached", *PROMPT),
        start(env, "convert", "org/cached", str(tmp_path / "out")),
    ]
    res, conv = (finish(proc) for proc in runs)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "e0" / "hub" / "org--cached").is_dir()
    assert conv.returncode == 0 and (tmp_path / "out" / "edge0.json").is_file(), conv.stderr


def test_full_disk_is_one_line(hub: Hub, tmp_path: Path) -> None:
    """The download's size against the free space, checked before a byte is written."""
    env = {**os.environ, **hub_env(tmp_path, hub)}
    code = (
        "import shutil, sys, collections\n"
        "u = collections.namedtuple('u', 'total used free')\n"
        "shutil.disk_usage = lambda p: u(10**9, 10**9 - 10**6, 10**6)\n"
        "from edge0.cli.main import main\n"
        "sys.argv = ['edge0', 'run', 'org/tiny', '-p', 'x']\n"
        "main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    one_line(res, "org/tiny", "is full", "GB are free", "HF_HOME")
    assert not [p for m, p, _ in hub.log if m == "GET" and "/resolve/" in p]
