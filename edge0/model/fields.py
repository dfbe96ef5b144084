"""Config fidelity: every transformers config field of a family is computed, refused or irrelevant.

`resolve(config)` reads config.json the way transformers does (its config class for the
model_type: absent keys take that model_type's defaults, older rope forms become
`rope_parameters`, derived values follow), then checks every field against the
family's audit rows (`Family.fields`, beside the rows all share): a value Edge0
cannot compute as transformers does is refused in one line naming the field and the
value. The same check runs for `edge0 run`, `edge0 convert` and an edge0 layout's
config (edge0.model.arch.normalize_config), and the table is what docs/models.md prints.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

from edge0.errors import ModelLoadError
from edge0.families import family_for
from edge0.families.audit import Fields, Rope
from edge0.families.common import COMMON, WRAPPER


def table(model_type: str) -> Fields:
    """Every audited field of `model_type`'s (text) config: COMMON plus the family's rows."""
    return {**COMMON, **family_for(model_type).fields}


def config_type(model_type: str) -> str:
    """The transformers config class `model_type` is read with."""
    return family_for(model_type).config_types.get(model_type, model_type)


def wrapped(model_type: str) -> bool:
    """Whether `model_type`'s config is a multimodal wrapper (the text model in text_config)."""
    text = family_for(model_type).text_type
    return text is not None and model_type != text


def transformers_view(config: dict[str, Any]) -> dict[str, Any]:
    """config.json as transformers' config class reads it (to_dict, model_type kept).

    Raises:
        ModelLoadError: transformers itself refuses the config (its message, one line).
    """
    import transformers

    model_type = str(config["model_type"])
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its rope advice is not the user's business here
    try:
        cfg = transformers.AutoConfig.for_model(config_type(model_type), **kwargs)
    except Exception as exc:  # noqa: BLE001 - transformers validates with many error types
        line = " ".join(str(exc).split())[:200]
        raise ModelLoadError(
            f"transformers' {model_type} config class refuses it ({type(exc).__name__}: {line}); "
            "fix the named field"
        ) from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    view: dict[str, Any] = cfg.to_dict()
    view["model_type"] = model_type
    return view


def resolve(config: dict[str, Any]) -> dict[str, Any]:
    """config.json with transformers' defaults filled in, every audited field checked.

    Keys of the original the config class drops (mlx-lm's own, e.g. `quantization`)
    are kept. Raises ModelLoadError naming the first field whose value Edge0 refuses.
    """
    return copy.deepcopy(_resolve(json.dumps(config, sort_keys=True)))


@functools.lru_cache(maxsize=64)
def _resolve(raw: str) -> dict[str, Any]:  # transformers' config classes take ~0.1 s
    config = json.loads(raw)
    view = {**config, **transformers_view(config)}
    model_type = str(view["model_type"])
    text = view.get("text_config")
    if wrapped(model_type) and isinstance(text, dict):
        _check(view, WRAPPER, model_type, "")
        text = {**(config.get("text_config") or {}), **text}
        _check(text, table(model_type), model_type, "text_config.")
        view["text_config"] = text
    else:
        _check(view, table(model_type), model_type, "")
    return view


def _check(cfg: dict[str, Any], rules: Fields, model_type: str, at: str) -> None:
    for key, rule in rules.items():
        if isinstance(rule, Rope):
            try:
                rule.check(cfg.get(key), cfg, model_type)
            except ModelLoadError as exc:
                raise ModelLoadError(f"{at}{exc}") from None
        elif key in cfg:
            try:
                rule.check(key, cfg.get(key), model_type, cfg)
            except ModelLoadError as exc:
                raise ModelLoadError(f"{at}{exc}") from None


__all__ = ["config_type", "resolve", "table", "transformers_view", "wrapped"]
