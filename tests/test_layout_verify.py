"""edge0 verify and load_layout on damaged checkpoints: clear errors naming file, layer, expert."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from layout_helpers import GROUP, tiny_hf

from edge0.cli.main import main
from edge0.errors import CheckpointError
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.load import load_layout
from edge0.layout.manifest import EXPERTS_FILE, MANIFEST_FILE, RESIDENT_FILE, ZSTD_FILE
from edge0.layout.verify import verify


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("verify")
    hf = tiny_hf(root, "qwen3_moe")
    convert(hf, root / "e0", ConvertOptions(group_size=GROUP, compress="zstd"))
    return root / "e0"


@pytest.fixture
def ckpt(good: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "copy"))


def _manifest(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((path / MANIFEST_FILE).read_text())


def test_good_checkpoint_verifies(ckpt: Path) -> None:
    report = verify(ckpt, progress=False)
    m = _manifest(ckpt)
    assert report.records == len(m["moe_layers"]) * m["n_experts"] and report.zstd
    assert report.bytes > report.records * m["record_size"]
    result = CliRunner().invoke(main, ["verify", str(ckpt)])
    assert result.exit_code == 0 and "ok:" in result.output and "GB/s" in result.output


def test_flipped_byte_names_layer_and_expert(ckpt: Path) -> None:
    m = _manifest(ckpt)
    record = 2 * m["n_experts"] + 5  # MoE layer ordinal 2, expert 5
    layer = m["moe_layers"][2]
    data = bytearray((ckpt / EXPERTS_FILE).read_bytes())
    data[record * m["record_size"] + 100] ^= 0x40
    (ckpt / EXPERTS_FILE).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"layer {layer} expert 5 fails its CRC32"):
        verify(ckpt, progress=False)
    with pytest.raises(CheckpointError, match=f"layer {layer} expert 5 fails its CRC32"):
        load_layout(ckpt)
    result = CliRunner().invoke(main, ["verify", str(ckpt)])
    assert result.exit_code == 2
    assert f"layer {layer} expert 5" in result.output


def test_truncated_experts_bin(ckpt: Path) -> None:
    m = _manifest(ckpt)
    size = (ckpt / EXPERTS_FILE).stat().st_size
    with open(ckpt / EXPERTS_FILE, "r+b") as f:
        f.truncate(size - m["record_size"] - 10)
    last_layer = m["moe_layers"][-1]
    expert = m["n_experts"] - 2
    for fn in (lambda: verify(ckpt, progress=False), lambda: load_layout(ckpt, experts="none")):
        with pytest.raises(CheckpointError, match=f"layer {last_layer} expert {expert} on are cut"):
            fn()


def test_wrong_format_version(ckpt: Path) -> None:
    m = _manifest(ckpt)
    m["format_version"] = 99
    (ckpt / MANIFEST_FILE).write_text(json.dumps(m))
    for fn in (lambda: verify(ckpt), lambda: load_layout(ckpt)):
        with pytest.raises(CheckpointError, match="format version 99"):
            fn()


@pytest.mark.parametrize("key, value", [("dtype", "\n"), ("name", "up_proj\r.weight")])
def test_a_field_that_cannot_print_is_one_line(ckpt: Path, key: str, value: str) -> None:
    """A record field whose name or dtype holds a line break is refused on one line that
    shows it escaped (a message quoting it raw broke in two)."""
    m = _manifest(ckpt)
    m["fields"][1][key] = value
    (ckpt / MANIFEST_FILE).write_text(json.dumps(m))
    for fn in (lambda: verify(ckpt), lambda: load_layout(ckpt)):
        with pytest.raises(
            CheckpointError, match=r"fields\[1\] 'name' and 'dtype' must be printable"
        ) as e:
            fn()
        assert "\n" not in str(e.value) and "\r" not in str(e.value)
        assert repr(value) in str(e.value)


@pytest.mark.parametrize("name", [MANIFEST_FILE, RESIDENT_FILE, EXPERTS_FILE, ZSTD_FILE])
def test_missing_files(ckpt: Path, name: str) -> None:
    (ckpt / name).unlink()
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        verify(ckpt, progress=False)
    if name != ZSTD_FILE:
        with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
            load_layout(ckpt, experts="none")


def test_corrupt_zstd_frame(ckpt: Path) -> None:
    data = bytearray((ckpt / ZSTD_FILE).read_bytes())
    index = np.fromfile(ckpt / "experts.zst.idx", dtype="<u8").reshape(-1, 2)
    off, length = index[3].tolist()
    data[off + length // 2] ^= 0xFF
    (ckpt / ZSTD_FILE).write_bytes(bytes(data))
    m = _manifest(ckpt)
    with pytest.raises(CheckpointError, match=f"layer {m['moe_layers'][0]} expert 3"):
        verify(ckpt, progress=False)


def test_truncated_resident(ckpt: Path) -> None:
    size = (ckpt / RESIDENT_FILE).stat().st_size
    with open(ckpt / RESIDENT_FILE, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(CheckpointError, match="resident.safetensors is truncated"):
        verify(ckpt, progress=False)
    with pytest.raises(CheckpointError, match="resident.safetensors is truncated"):
        load_layout(ckpt)


def test_missing_resident_tensor_is_named(ckpt: Path) -> None:
    import mlx.core as mx

    weights = mx.load(str(ckpt / RESIDENT_FILE))
    name = sorted(k for k in weights if k.endswith("input_layernorm.weight"))[0]
    del weights[name]
    mx.save_safetensors(str(ckpt / RESIDENT_FILE), weights)
    for mode in ("none", "resident"):
        with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
            load_layout(ckpt, experts=mode)
