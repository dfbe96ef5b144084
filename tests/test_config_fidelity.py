"""Config fidelity: every transformers config field is audited; computed values match
transformers' logits; refused values stop `run` and `convert` in one line, before any write."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from test_reference import edge0_logits

from edge0.cli.main import main as cli
from edge0.errors import ModelLoadError
from edge0.families import every_family, supported_list
from edge0.families.audit import COMPUTED, EDGE0, IRRELEVANT, REFUSED, Rope
from edge0.families.common import WRAPPER
from edge0.model.fields import table, transformers_view, wrapped
from edge0.model.loader import load
from edge0.synth.fidelity_probes import REFUSALS, VARIANTS
from edge0.synth.tiny_families import fixture_file, write_family

FIXTURES = Path(__file__).parent / "fixtures"
TOL = 1e-4  # the family tests' bar (tests/test_families.py)
MODEL_TYPES = supported_list().split(", ")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_transformers_field_is_audited(model_type: str) -> None:
    """Each field of the model_type's transformers config class has a row, and a known verdict."""
    view = transformers_view({"model_type": model_type})
    rows = table(model_type)
    text = view.get("text_config") if wrapped(model_type) else None
    if text is not None:
        assert sorted(set(view) - set(WRAPPER)) == []
    assert sorted(set(text if text is not None else view) - set(rows)) == []
    kinds = {COMPUTED, EDGE0, IRRELEVANT, REFUSED}
    assert all(isinstance(r, Rope) or r.does in kinds for r in rows.values())


def test_defaults_are_transformers_defaults_for_the_model_type() -> None:
    """A key absent from config.json takes transformers' default for that model_type."""
    from edge0.model.arch import normalize_config

    olmoe = normalize_config({"model_type": "olmoe"})
    assert olmoe["tie_word_embeddings"] is False  # mlx-lm's olmoe default is True
    assert olmoe["rope_theta"] == 10000.0
    qwen2 = normalize_config({"model_type": "qwen2_moe"})
    assert qwen2["rope_theta"] == 10000.0  # mlx-lm's qwen2_moe default is 1e6
    assert normalize_config({"model_type": "mixtral"})["rope_theta"] == 1e6


def _edited(src: Path, changes: dict[str, Any]) -> None:
    config = json.loads((src / "config.json").read_text())
    for key, value in changes.items():
        owner = config
        *path, leaf = key.split(".")
        for step in path:
            owner = owner[step]
        owner[leaf] = value
    (src / "config.json").write_text(json.dumps(config))


def _checkpoint(base: str, dst: Path) -> Path:
    if base in ("qwen3_moe", "qwen3_5_moe"):
        shutil.copytree(FIXTURES / base, dst)
        return dst
    return write_family(fixture_file(FIXTURES, base), dst)


@pytest.mark.parametrize(("base", "changes", "message"), REFUSALS)
def test_refused_values_stop_run_and_convert_in_one_line(
    tmp_path: Path, base: str, changes: dict[str, Any], message: str
) -> None:
    src = _checkpoint(base, tmp_path / "src")
    _edited(src, changes)
    config = str(src / "config.json")
    with pytest.raises(ModelLoadError) as info:
        load(src)
    assert str(info.value).startswith(f"{config}: {message}")
    assert "\n" not in str(info.value) and "re-convert" not in str(info.value)
    for args in (
        ["convert", str(src), str(tmp_path / "out")],
        ["run", str(src), "-p", "hi", "--max-tokens", "1"],
    ):
        result = CliRunner().invoke(cli, args)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2, result.output
        assert len(lines) == 1 and lines[0].startswith(f"edge0: error: {config}: {message}")
    assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_computed_values_match_transformers(tmp_path: Path, name: str) -> None:
    """Each family's non-default computed values against transformers' fp32 golden logits."""
    golden = dict(np.load(FIXTURES / "golden" / f"{name}.npz"))
    path = write_family(fixture_file(FIXTURES, name), tmp_path / name)
    base, changes = VARIANTS[name]
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():  # the fixture holds the values it claims to test
        owner = config
        for step in key.split("."):
            owner = owner[step]
        assert owner == value, key
    ours = edge0_logits(load(path), golden["prompt_ids"], golden["decode_ids"])
    for key in ("prefill_logits", "decode_logits"):
        assert float(np.abs(ours[key] - golden[key]).max()) <= TOL, key
    chain = [ours["prefill_logits"][-1].argmax(), *ours["decode_logits"][:-1].argmax(-1)]
    assert [int(t) for t in chain] == golden["decode_ids"].tolist()


def test_tables_cover_every_family() -> None:
    for model_type in MODEL_TYPES:
        assert table(model_type)
    assert all(family.fields for family in every_family())


def test_docs_audit_is_what_the_code_does() -> None:
    """docs/models.md's audit tables are tools/config_audit.py's output, verbatim."""
    from tool_helpers import load_tool

    root = Path(__file__).resolve().parent.parent
    module = load_tool("tools/config_audit.py")
    text = (root / "docs" / "models.md").read_text()
    start = text.index("<!-- config-audit:start -->\n") + len("<!-- config-audit:start -->\n")
    assert text[start : text.index("<!-- config-audit:end -->")] == module.audit()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge0.layout.convert import ConvertOptions, convert

    out = tmp_path_factory.mktemp("layout") / "e0"
    convert(FIXTURES / "qwen3_moe", out, ConvertOptions(group_size=32))
    return out


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_experts_per_tok": 0}, "num_experts_per_tok=0 is invalid: qwen3_moe's"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok=9 is invalid"),  # 8 experts
        ({"num_key_value_heads": 3}, "num_key_value_heads=3 is invalid"),
        ({"hidden_size": 0}, "hidden_size=0 is invalid"),
        ({"num_experts_per_tok": "2"}, "transformers' qwen3_moe config class refuses it"),
        ({"hidden_act": "swiglu"}, 'hidden_act="swiglu" is invalid: qwen3_moe\'s hidden_act'),
    ],
)
def test_layout_config_values_fail_verify_and_run_alike(
    tmp_path: Path, layout: Path, changes: dict[str, Any], message: str
) -> None:
    """A bad config value in edge0.json: one line from `verify` and `run` alike."""
    dst = tmp_path / "e0"
    shutil.copytree(layout, dst)
    doc = json.loads((dst / "edge0.json").read_text())
    doc["config"].update(changes)
    (dst / "edge0.json").write_text(json.dumps(doc))
    for args in (["verify", str(dst)], ["run", str(dst), "-p", "hi", "--max-tokens", "1"]):
        result = CliRunner().invoke(cli, args)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2, result.output
        assert len(lines) == 1 and lines[0].startswith(f"edge0: error: {dst / 'edge0.json'}: ")
        assert message in lines[0]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_converts_and_its_layout_config_is_a_fixed_point(tmp_path: Path, name: str) -> None:
    """What convert stores reads back the same: normalize_config(normalize_config(c)) == once."""
    from edge0.layout.convert import ConvertOptions, convert
    from edge0.layout.load import check_layout
    from edge0.model.arch import normalize_config

    src = write_family(fixture_file(FIXTURES, name), tmp_path / "src")
    once = normalize_config(json.loads((src / "config.json").read_text()))
    assert normalize_config(once) == once
    manifest = convert(src, tmp_path / "e0", ConvertOptions(group_size=32))
    assert check_layout(tmp_path / "e0").n_records == manifest.n_records
