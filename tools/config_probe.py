"""Probe config values against transformers: Edge0's logits or its refusal, per value (torch).

For each probe (a family's tiny fixture with some config values changed, the changed
config run through transformers' own config class and its `save_pretrained` layout),
this prints the max |logit delta| between `edge0.load` and transformers' fp32 model
(prompt + 8 cached greedy steps), or Edge0's one-line refusal, or the exception that
escaped. It is how the "what Edge0 does" column of the config audit in docs/models.md
was checked; `tests/test_config_fidelity.py` keeps the answers. Usage:

    .venv/bin/python tools/config_probe.py [NAME_SUBSTRING ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import click
import numpy as np
from teacher_golden import golden_tool  # tools/ is on sys.path when this script runs

from edge0.errors import Edge0Error
from edge0.synth.fidelity_probes import PROBES
from edge0.synth.tiny_families import write_variant

ROOT = Path(__file__).resolve().parent.parent


def probe(name: str, base: str, changes: dict[str, Any]) -> str:
    """One line: the delta, Edge0's refusal or the escaped exception."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_reference import edge0_logits

    from edge0.model.loader import load

    golden = golden_tool()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = write_variant(base, changes, Path(tmp) / name)
        except Exception as exc:  # noqa: BLE001 - transformers refuses the config itself
            return f"transformers refuses: {type(exc).__name__}: {str(exc)[:150]}"
        try:
            ref = golden.reference_logits(path, golden.prompt_ids(path))
        except BaseException as exc:  # noqa: BLE001 - SystemExit from unclean loads too
            return f"transformers fails: {type(exc).__name__}: {str(exc)[:150]}"
        try:
            ours = edge0_logits(load(path), ref["prompt_ids"], ref["decode_ids"])
        except Edge0Error as exc:
            return f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001 - what the audit hunts for
            tb = traceback.format_exception(exc)[-3:]
            return f"TRACEBACK {type(exc).__name__}: {exc} | {' '.join(tb)[:300]}"
    err = max(float(np.abs(ours[k] - ref[k]).max()) for k in ("prefill_logits", "decode_logits"))
    flag = "ok" if err <= 1e-4 else "WRONG"
    return f"{flag} max |dlogit| {err:.1e}"


@click.command()
@click.argument("names", nargs=-1)
def main(names: tuple[str, ...]) -> None:
    for name, (base, changes) in PROBES.items():
        if names and not any(n in name for n in names):
            continue
        click.echo(f"{name}: {json.dumps(changes)} -> {probe(name, base, changes)}", nl=True)


if __name__ == "__main__":
    main()
