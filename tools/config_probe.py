"""Probe config values against transformers: Edge0's logits or its refusal, per value.

Each probe (edge0.synth.fidelity_probes.PROBES: a family's tiny fixture with some config
values changed) ends in one line: `ok` (Edge0's fp32 logits within 1e-4 of transformers'
for the prompt's last position and 8 cached greedy steps, the greedy chain equal),
`refused` (Edge0's one-line refusal, where transformers refuses or fails too: `as
transformers`), `WRONG` (a silent difference), `REFUSED` (Edge0 refuses what transformers
computes) or `TRACEBACK` (an exception that escaped). Two sources for transformers' side:

    .venv/bin/python tools/config_probe.py [NAME ...]           # live (needs torch)
    .venv/bin/python tools/config_probe.py --golden [NAME ...]  # committed references
    .venv/bin/python tools/config_probe.py --write [NAME ...]   # regenerate them (torch)

The references are tests/fixtures/probes.json.gz (each probe's config and transformers'
tensor layout, or how transformers refused it) and tests/fixtures/golden/probes.npz;
tests/test_config_probes.py runs the golden mode over every probe.
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import click
import numpy as np

from edge0.errors import Edge0Error
from edge0.synth.fidelity_probes import PROBES
from edge0.synth.tiny_families import config_dict, variant_spec, write_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "tests" / "fixtures" / "probes.json.gz"
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "probes.npz"
TOL = 1e-4


def _golden_tool() -> Any:
    sys.path.insert(0, str(ROOT / "tools"))
    from teacher_golden import golden_tool

    return golden_tool()


def _edge0(path: Path, prompt: np.ndarray, decode: np.ndarray) -> dict[str, np.ndarray]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_reference import edge0_logits

    from edge0.model.loader import load

    return edge0_logits(load(path), prompt, decode)


def tail(logits: dict[str, np.ndarray]) -> np.ndarray:
    """The prompt's last position and the decode steps: (1 + steps, V)."""
    return np.concatenate([logits["prefill_logits"][-1:], logits["decode_logits"]])


def compare(path: Path, ref: dict[str, np.ndarray]) -> str:
    """Edge0 on the checkpoint `path` against a reference {prompt_ids, decode_ids, tail}."""
    try:
        ours = _edge0(path, ref["prompt_ids"], ref["decode_ids"])
    except Edge0Error as exc:
        return f"REFUSED (transformers computes it): {exc}"
    except Exception as exc:  # noqa: BLE001 - what the probe hunts for
        return f"TRACEBACK {type(exc).__name__}: {exc} | {traceback.format_exc()[-300:]}"
    err = float(np.abs(tail(ours) - ref["tail"]).max())
    chain = [int(t) for t in tail(ours)[:-1].argmax(-1)]
    flag = "ok" if err <= TOL and chain == ref["decode_ids"].tolist() else "WRONG"
    return f"{flag} max |dlogit| {err:.1e}"


def refused_as_transformers(base: str, changes: dict[str, Any], why: str) -> str:
    """Transformers refused or failed on the probe: Edge0 must refuse it too (config alone)."""
    from edge0.model.arch import normalize_config

    try:
        config = config_dict(base, 300, changes)
    except Exception:  # noqa: BLE001 - transformers' config class refuses it: so does Edge0's
        return f"refused as transformers ({why})"
    try:
        normalize_config(config)
    except Edge0Error as exc:
        return f"refused as transformers ({why}): {exc}"
    except Exception as exc:  # noqa: BLE001
        return f"TRACEBACK {type(exc).__name__}: {exc}"
    return f"WRONG: transformers {why}, Edge0 computes it"


def live(name: str, base: str, changes: dict[str, Any]) -> tuple[str, Any]:
    """One probe against transformers run now: (line, the references to keep)."""
    golden = _golden_tool()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            spec = variant_spec(base, changes)
        except Exception as exc:  # noqa: BLE001 - transformers refuses the config itself
            why = f"refuses: {type(exc).__name__}: {' '.join(str(exc).split())[:150]}"
            return refused_as_transformers(base, changes, why), {"transformers": why}
        path = write_spec(spec, Path(tmp) / name)
        try:
            raw = golden.reference_logits(path, golden.prompt_ids(path))
        except BaseException as exc:  # noqa: BLE001 - SystemExit from unclean loads too
            why = f"fails: {type(exc).__name__}: {' '.join(str(exc).split())[:150]}"
            return refused_as_transformers(base, changes, why), {"transformers": why}
        ref = {"prompt_ids": raw["prompt_ids"], "decode_ids": raw["decode_ids"], "tail": tail(raw)}
        return compare(path, ref), {"spec": spec, "ref": ref}


def golden(name: str, base: str, changes: dict[str, Any], specs: dict[str, Any]) -> str:
    """One probe against its committed references (no torch)."""
    entry = specs.get(name)
    if entry is None:
        return "MISSING: no committed reference (tools/config_probe.py --write)"
    if "transformers" in entry:
        return refused_as_transformers(base, changes, entry["transformers"])
    arrays = np.load(GOLDEN)
    ref = {k: arrays[f"{name}/{k}"] for k in ("prompt_ids", "decode_ids", "tail")}
    with tempfile.TemporaryDirectory() as tmp:
        return compare(write_spec(entry["spec"], Path(tmp) / name), ref)


def load_specs() -> dict[str, Any]:
    out: dict[str, Any] = json.loads(gzip.decompress(SPECS.read_bytes()))
    return out


def selected(names: tuple[str, ...]) -> dict[str, tuple[str, dict[str, Any]]]:
    return {n: p for n, p in PROBES.items() if not names or any(s in n for s in names)}


def write(names: tuple[str, ...]) -> None:
    """Regenerate the committed references of the selected probes (torch)."""
    specs = load_specs() if SPECS.exists() else {}
    arrays = dict(np.load(GOLDEN)) if GOLDEN.exists() else {}
    for name, (base, changes) in selected(names).items():
        line, keep = live(name, base, changes)
        click.echo(f"{name}: {line}")
        for key in [k for k in arrays if k.startswith(f"{name}/")]:
            del arrays[key]
        if "ref" in keep:
            specs[name] = {"spec": keep["spec"]}
            arrays.update({f"{name}/{k}": v for k, v in keep["ref"].items()})
        else:
            specs[name] = keep
    specs = {n: specs[n] for n in sorted(specs) if n in PROBES}
    SPECS.write_bytes(gzip.compress(json.dumps(specs, sort_keys=True).encode(), mtime=0))
    np.savez_compressed(GOLDEN, **{k: arrays[k] for k in sorted(arrays)})


@click.command()
@click.argument("names", nargs=-1)
@click.option("--golden", "use_golden", is_flag=True, help="Compare with committed references.")
@click.option("--write", "do_write", is_flag=True, help="Regenerate the references (torch).")
def main(names: tuple[str, ...], use_golden: bool, do_write: bool) -> None:
    if do_write:
        write(names)
        return
    specs = load_specs() if use_golden else {}
    for name, (base, changes) in selected(names).items():
        line = golden(name, base, changes, specs) if use_golden else live(name, base, changes)[0]
        click.echo(f"{name}: {json.dumps(changes)} -> {line}")


if __name__ == "__main__":
    main()
