"""Files a user cannot read (permission denied, a link into a deleted cache entry, a directory
where a file belongs) are one `edge0: error:` line from run, verify and convert; --io-workers
is bounded and a reader thread that cannot start is a one-line error too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from runtime_helpers import build_store

from edge0.cli.main import main
from edge0.errors import ConfigError
from edge0.runtime.io.readers import ReaderThreads
from edge0.synth.tiny import TinySpec, write_checkpoint

EDGE0 = [sys.executable, "-c", "from edge0.cli.main import main; main()"]
NOBODY = 65534


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("unreadable"), "qwen3_moe")


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(TinySpec(model_type="qwen3_moe"), tmp_path_factory.mktemp("h") / "hf")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory another user can enter (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="edge0-unreadable-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o777 if p.is_dir() else 0o644)
    return dst


def one_line_error(out: str, code: int, *needles: str) -> None:
    assert code == 2, out
    assert out.startswith("edge0: error: ") and out.count("\n") == 1, out
    for needle in needles:
        assert needle in out, out


def edge0(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


BREAKS: dict[str, Callable[[Path], None]] = {
    "a directory": lambda p: (p.unlink(), p.mkdir()),  # type: ignore[dict-item]
    "a broken link": lambda p: (p.unlink(), p.symlink_to(p.parent / "deleted-blob")),  # type: ignore[dict-item]
}
WORDS = {
    "a directory": "is a directory where a file belongs",
    "a broken link": "deleted-blob, which does not exist",
}


@pytest.mark.parametrize("how", sorted(BREAKS))
@pytest.mark.parametrize("name", ["experts.bin", "resident.safetensors", "tokenizer.json"])
def test_run_and_verify_name_a_file_that_cannot_be_read(
    store: Path, tmp_path: Path, how: str, name: str
) -> None:
    model = copy(store, tmp_path / "m")
    BREAKS[how](model / name)
    for args in (["verify", str(model)], ["run", str(model), "-p", "hi", "--max-tokens", "2"]):
        r = edge0(*args)
        one_line_error(r.output, r.exit_code, str(model / name), WORDS[how])


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_convert_refuses_a_source_tokenizer_it_cannot_read(
    hf: Path, tmp_path: Path, how: str
) -> None:
    src = copy(hf, tmp_path / "src")
    BREAKS[how](src / "tokenizer.json")  # before: converted without it, then failed to run
    r = edge0("convert", str(src), str(tmp_path / "out"), "--group-size", "32")
    one_line_error(r.output, r.exit_code, str(src / "tokenizer.json"), WORDS[how], "SRC")
    assert not (tmp_path / "out").exists()


def as_another_user() -> list[str]:
    """The command prefix that makes file permissions apply: none, or `setpriv` to nobody
    when the tests run as root (root reads anything)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot be made to apply")
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("verify", "experts.bin"),
        ("run", "experts.bin"),
        ("run", "tokenizer.json"),
        ("convert", "tokenizer.json"),
        ("convert", "model.safetensors"),
    ],
)
def test_permission_denied_is_one_line(
    store: Path, hf: Path, scratch: Path, command: str, name: str
) -> None:
    model = copy(hf if command == "convert" else store, scratch / "m")
    (model / name).chmod(0)
    args = {
        "verify": ["verify", str(model)],
        "run": ["run", str(model), "-p", "hi", "--max-tokens", "2"],
        "convert": ["convert", str(model), str(scratch / "out"), "--group-size", "32"],
    }
    env = {**os.environ, "HOME": str(scratch), "EDGE0_CACHE": str(scratch / "cache")}
    proc = subprocess.run(
        [*as_another_user(), *EDGE0, *args[command]],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=scratch,
    )
    err = "\n".join(ln for ln in proc.stderr.splitlines() if "PyTorch" not in ln) + "\n"
    assert "Traceback" not in err, err
    one_line_error(err, proc.returncode, str(model / name), "Permission denied")


def test_io_workers_has_an_upper_bound(store: Path) -> None:
    r = edge0("run", str(store), "-p", "hi", "--max-tokens", "2", "--io-workers", "100000")
    one_line_error(r.output, r.exit_code, "--io-workers", "between 1 and 64", "100000")


def test_a_reader_thread_that_cannot_start_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:  # the third thread hits the process's limit
        if self.name.startswith("edge0-reader") and len(started) == 2:
            raise RuntimeError("can't start new thread")
        real_start(self)
        started.append(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(ConfigError, match=r"thread 3 of 8 \(can't start new thread\); lower "):
        ReaderThreads(8, lambda ticket, i: None)
    monkeypatch.undo()
    for t in started:
        t.join(timeout=10)
        assert not t.is_alive()  # the two that started were stopped again
