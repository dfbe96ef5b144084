"""`edge0 verify` and the prerouter heads: it opens them as a run does (a truncated weights file or
a broken config is refused, as `run` refuses them), and edge0.json carries their CRC32s, so a
flipped byte is caught too; layouts written before the CRCs were recorded still verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from server_helpers import demo_model

from edge0.cli.main import main
from edge0.layout.artifacts import record_artifacts
from edge0.layout.manifest import MANIFEST_FILE, Manifest
from edge0.layout.readable import ARTIFACT_FILES
from edge0.layout.safetensors_io import read_header


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model(tmp_path_factory)


@pytest.fixture
def layout(demo: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo, tmp_path / "demo"))


def without_crcs(layout: Path) -> Path:
    """`layout` as written before edge0.json recorded the heads' CRC32s."""
    d = json.loads((layout / MANIFEST_FILE).read_text())
    del d["artifacts_crc32"]
    (layout / MANIFEST_FILE).write_text(json.dumps(d))
    return layout


def verify(path: Path) -> Result:
    return CliRunner().invoke(main, ["verify", str(path)])


def refused(path: Path, words: str) -> None:
    r = verify(path)
    assert r.exit_code == 2 and r.output.startswith("edge0: error: "), r.output
    assert r.output.count("\n") == 1 and words in r.output, r.output


def test_a_converted_layout_records_and_checks_its_heads(layout: Path) -> None:
    crcs = Manifest.load(layout).artifacts_crc32
    assert crcs is not None and set(crcs) == set(ARTIFACT_FILES)  # the demo ships both horizons
    r = verify(layout)
    assert r.exit_code == 0, r.output
    assert "prerouter heads (token, layer horizon) open as a run opens them" in r.output
    assert "no CRC32" not in r.output


@pytest.mark.parametrize("crcs", [True, False])
def test_a_truncated_heads_file_is_refused(layout: Path, crcs: bool) -> None:
    path = layout / "prerouter.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    refused(layout if crcs else without_crcs(layout), "prerouter.safetensors")


@pytest.mark.parametrize("crcs", [True, False])
def test_a_broken_heads_config_is_refused(layout: Path, crcs: bool) -> None:
    (layout / "prerouter-layer.json").write_text("{")
    refused(layout if crcs else without_crcs(layout), "prerouter-layer.json")


def test_a_flipped_byte_in_the_heads_is_caught_by_its_crc(layout: Path) -> None:
    path = layout / "prerouter.safetensors"
    raw = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")  # past the header: tensor data
    raw[start + (len(raw) - start) // 2] ^= 0x01  # still loads: only the CRC can tell
    path.write_bytes(bytes(raw))
    assert read_header(path)  # the header is intact
    refused(layout, "prerouter.safetensors fails its CRC32 check")


def test_one_file_of_a_pair_is_refused(layout: Path) -> None:
    (layout / "prerouter.json").unlink()
    refused(layout, "prerouter.json is missing")


def test_heads_of_another_model_are_refused(layout: Path) -> None:
    path = layout / "prerouter.json"
    config = json.loads(path.read_text())
    config["moe_layers"] = config["moe_layers"][:-1]
    config["wrap"] = True
    path.write_text(json.dumps(config))
    record_artifacts(layout)  # a consistent CRC: the shape check must catch it
    refused(layout, "heads for MoE layers")


def test_an_older_layout_without_crcs_still_verifies(layout: Path) -> None:
    r = verify(without_crcs(layout))
    assert r.exit_code == 0 and "no CRC32 recorded for prerouter.safetensors" in r.output


def test_heads_rewritten_and_recorded_verify(layout: Path) -> None:
    src = layout / "prerouter.json"
    config = json.loads(src.read_text())
    config["info"] = {"note": "retrained"}
    src.write_text(json.dumps(config))
    refused(layout, "prerouter.json fails its CRC32 check")
    record_artifacts(layout)  # what `edge0 tune` and `edge0 train heads` do after writing
    assert verify(layout).exit_code == 0
