"""The other forms a family's checkpoint comes in, made from its transformers-layout files.

A family module declares its forms (`Family.forms`: e.g. gpt-oss' hub MXFP4 release, with
golden logits of its own) and the form mlx-lm's own loader reads where its `sanitize`
cannot read transformers' layout (`Family.mlx_lm_form`). Both write the config
normalised (`rope_scaling` / `rope_theta` filled in, as released config.json files have
them; mlx-lm does not read transformers 5's `rope_parameters`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx

from edge0.families import Form, every_family, family_for
from edge0.families.base import Written
from edge0.model.arch import normalize_config

_SIDE = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# derived fixture forms: name -> (the family fixture it is made from, its writer)
FORMS: dict[str, tuple[str, Form]] = {
    name: (f.name, form) for f in every_family() for name, form in f.own("forms").items()
}


def _read(src: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    weights = mx.load(str(src / "model.safetensors"))
    assert isinstance(weights, dict)
    return weights, normalize_config(json.loads((src / "config.json").read_text()))


def _write(src: Path, out: Path, written: Written) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name in _SIDE:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    tensors, config, fmt = written
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": fmt})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def write_form(form: Form, src: Path, out: Path) -> Path:
    """Write checkpoint `src` (transformers layout) in another `form` into `out`."""
    return _write(src, out, form(*_read(src)))


def derived(name: str, src: Path, out: Path) -> Path:
    """The derived fixture form `name` (FORMS) of its family's checkpoint `src`, in `out`."""
    return write_form(FORMS[name][1], src, out)


def mlx_lm_readable(src: Path, out: Path) -> Path:
    """`src` in a form mlx-lm's own loader reads: itself, or its family's `mlx_lm_form`."""
    weights, config = _read(src)
    written = family_for(str(config["model_type"])).mlx_lm_form(dict(weights), config)
    return src if written is None else _write(src, out, written)
