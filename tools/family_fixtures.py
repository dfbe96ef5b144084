"""Regenerate the tiny family fixtures and their golden logits (needs torch: the train extra).

For each family: tests/fixtures/families/<model_type>.json (transformers' config and the
tensor layout its save_pretrained writes) and tests/fixtures/golden/<model_type>.npz
(transformers fp32 logits for the fixed prompt + 8 cached greedy steps); derived forms
(a family's `forms`, e.g. gpt_oss_mxfp4, the hub's MXFP4 release of the gpt_oss fixture)
and config variants (a family's `variant`: its fixture with computed non-default config
values) get golden logits of their own. Usage:

    .venv/bin/python tools/family_fixtures.py [MODEL_TYPE ...]
    .venv/bin/python tools/family_fixtures.py --report   # deltas vs golden, no torch
    .venv/bin/python tools/family_fixtures.py --rope     # tests/test_rope.py's references
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click
import numpy as np
from teacher_golden import golden_tool  # tools/ is on sys.path when this script runs

from edge0.synth.fidelity_probes import VARIANTS
from edge0.synth.forms import FORMS, write_form
from edge0.synth.tiny_families import CONFIGS, fixture_file, write_family, write_fixture

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def report(model_types: tuple[str, ...]) -> None:
    """Max |logit delta| of edge0.load against the committed golden files (no torch)."""
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    edge0_logits = importlib.import_module("test_reference").edge0_logits
    from edge0.model.loader import load

    for model_type in model_types or (*CONFIGS, *FORMS, *VARIANTS):
        g = dict(np.load(FIXTURES / "golden" / f"{model_type}.npz"))
        with tempfile.TemporaryDirectory() as tmp:
            path = _checkpoint(model_type, Path(tmp))
            ours = edge0_logits(load(path), g["prompt_ids"], g["decode_ids"])
        pre = float(np.abs(ours["prefill_logits"] - g["prefill_logits"]).max())
        dec = float(np.abs(ours["decode_logits"] - g["decode_logits"]).max())
        click.echo(f"{model_type}: max |dlogit| prefill {pre:.1e}, 8 decode steps {dec:.1e}")


def _checkpoint(name: str, tmp: Path) -> Path:
    """The tiny checkpoint of a family fixture or of a derived form (FORMS) under `tmp`."""

    base, writer = FORMS.get(name, (name, None))
    path = write_family(fixture_file(FIXTURES, base), tmp / base)
    return path if writer is None else write_form(writer, path, tmp / name)


@click.command()
@click.argument("model_types", nargs=-1)
@click.option("--report", "only_report", is_flag=True, help="Only compare against golden files.")
@click.option("--rope", is_flag=True, help="Write tests/fixtures/rope_golden.json (torch).")
def main(model_types: tuple[str, ...], only_report: bool, rope: bool) -> None:
    if only_report:
        report(model_types)
        return
    if rope:  # transformers' frequencies for tests/test_rope.py's cases
        import importlib
        import json
        import sys

        sys.path.insert(0, str(ROOT / "tests"))
        table = importlib.import_module("test_rope").golden_table()
        (FIXTURES / "rope_golden.json").write_text(json.dumps(table, indent=1) + "\n")
        return
    golden = golden_tool()
    for model_type in model_types or (*CONFIGS, *FORMS, *VARIANTS):
        if model_type in CONFIGS:
            write_fixture(FIXTURES, model_type)
        elif model_type in VARIANTS:  # a family's fixture with computed non-default values
            base, changes = VARIANTS[model_type]
            write_fixture(FIXTURES, base, changes, name=model_type)
        with tempfile.TemporaryDirectory() as tmp:
            path = _checkpoint(model_type, Path(tmp))
            result = golden.reference_logits(path, golden.prompt_ids(path))
        target = FIXTURES / "golden" / f"{model_type}.npz"
        np.savez_compressed(target, **result)
        click.echo(f"{model_type}: {target.name}, decode ids {result['decode_ids'].tolist()}")


if __name__ == "__main__":
    main()
