"""convert never loses data: DST vs SRC (symlinks too), what --force replaces, leftovers, ENOSPC."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import edge0.layout.writer as writer_mod
from edge0.cli.main import main
from edge0.errors import ConversionError
from edge0.layout.atomic import MARKER_FILE
from edge0.layout.convert import ConvertOptions, convert
from edge0.synth.tiny import TinySpec, write_checkpoint

FORCE = ConvertOptions(group_size=32, force=True)


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    return write_checkpoint(TinySpec(model_type="qwen3_moe"), tmp_path / "a" / "src")


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


@pytest.mark.parametrize("where", ["same", "inside", "contains", "symlink", "symlinked-parent"])
def test_dst_that_is_inside_or_contains_src_is_refused(src: Path, where: str) -> None:
    before = digest(src.parent)
    link = src.parent.parent / "link"
    dst = {
        "same": src,
        "inside": src / "out",
        "contains": src.parent,
        "symlink": link,
        "symlinked-parent": link / "deeper",
    }[where]
    if where == "symlink":
        link.symlink_to(src)
    elif where == "symlinked-parent":
        link.symlink_to(src)
    with pytest.raises(ConversionError, match="SRC"):
        convert(src, dst, FORCE)
    assert digest(src.parent) == before


def test_cli_convert_src_src_force_is_a_one_line_error(src: Path) -> None:
    before = digest(src)
    res = CliRunner().invoke(main, ["convert", str(src), str(src), "--force"])
    assert res.exit_code == 2
    assert res.output.startswith("edge0: error: DST") and res.output.count("\n") == 1
    assert digest(src) == before


def test_force_replaces_only_edge0_outputs_or_empty_dirs(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "thesis.txt").write_text("years of work")
    with pytest.raises(ConversionError, match="not an Edge0 output"):
        convert(src, dst, FORCE)
    assert (dst / "thesis.txt").read_text() == "years of work"
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConversionError, match="not a directory Edge0 wrote"):
        convert(src, afile, FORCE)
    assert afile.read_text() == "x"
    (dst / "thesis.txt").unlink()
    convert(src, dst, FORCE)  # empty: fine
    assert (dst / "edge0.json").is_file() and (dst / MARKER_FILE).is_file()
    convert(src, dst, FORCE)  # an earlier Edge0 output: fine
    assert (dst / "edge0.json").is_file()


def test_leftovers_of_a_killed_convert_are_removed_and_live_ones_reported(
    src: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "out"
    dead = tmp_path / "out.tmp-abcd1234"
    dead.mkdir()
    (dead / MARKER_FILE).write_text(json.dumps({"pid": dead_pid(), "host": os.uname().nodename}))
    (dead / "experts.bin").write_bytes(b"\0" * 4096)
    unmarked = tmp_path / "out.tmp-zz99yy88"  # killed before it wrote its marker, long ago
    unmarked.mkdir()
    os.utime(unmarked, (time.time() - 3600, time.time() - 3600))  # (a young one may be live)
    live = tmp_path / "out.tmp-live0000"
    live.mkdir()
    (live / MARKER_FILE).write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    unrelated = tmp_path / "outer.tmp-abcd1234"  # another DST's: not ours to touch
    unrelated.mkdir()
    convert(src, dst, ConvertOptions(group_size=32))
    assert not dead.exists() and not unmarked.exists()
    assert live.exists() and unrelated.exists()
    assert (dst / "edge0.json").is_file()


def test_a_previous_dst_moved_aside_by_a_killed_convert_is_put_back(
    src: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "out"
    convert(src, dst, ConvertOptions(group_size=32))
    before = digest(dst)
    old = tmp_path / "out.old-abcd1234"
    old.mkdir()
    dst.rename(old / "out")  # killed between its two renames: DST is missing
    with pytest.raises(ConversionError, match="already exists"):  # restored, so not replaced
        convert(src, dst, ConvertOptions(group_size=32))
    assert digest(dst) == before and not old.exists()


def test_disk_full_during_convert_removes_the_partial_output(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = writer_mod.RecordWriter.write
    calls = {"n": 0}

    def full(self: writer_mod.RecordWriter, record: object) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", "experts.bin")
        return real(self, record)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_mod.RecordWriter, "write", full)
    res = CliRunner().invoke(
        main, ["convert", str(src), str(tmp_path / "out"), "--group-size", "32"]
    )
    assert res.exit_code == 2, res.output
    assert res.output.startswith("edge0: error: writing") and "No space left" in res.output
    assert res.output.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # nothing left behind


def test_converted_directory_gets_the_umask_permissions(tmp_path: Path) -> None:
    src = write_checkpoint(TinySpec(model_type="qwen3_moe"), tmp_path / "hf")
    old = os.umask(0o022)
    try:
        convert(src, tmp_path / "out", ConvertOptions())
    finally:
        os.umask(old)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700
