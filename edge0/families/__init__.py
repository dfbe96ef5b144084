"""Model families: one module per MoE model family, found by scanning this package.

A family module holds everything specific to its model_type (base.py has the contract):
its config keys and audit rows, its router's arithmetic, its expert tensor names, what
its caches hold, whether its rows stack in a batch, its tiny test fixture and flagship
shapes. The rest of Edge0 asks the family and never names one. Adding a family is one
new module here plus its fixture files (docs/models.md).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

from edge0.errors import ModelLoadError
from edge0.families.base import Family, Form


def _discover() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Family) and cls.__module__ == module.__name__ and cls.name:
                fam = cls()
                for model_type in cls.model_types:
                    found[model_type] = fam
    return found


FAMILIES: dict[str, Family] = _discover()


def every_family() -> list[Family]:
    """Each family once (one instance per module class), in model_type order."""
    return list({id(f): f for f in FAMILIES.values()}.values())


def supported_list() -> str:
    """The supported model_types, for error messages and docs."""
    return ", ".join(sorted(t for t in FAMILIES if not t.endswith("_text")))


def family_for(model_type: str) -> Family:
    """The family of a config.json model_type; ModelLoadError naming the supported list."""
    fam = FAMILIES.get(model_type)
    if fam is None:
        raise ModelLoadError(
            f"model_type {model_type!r} is not a supported MoE family; Edge0 supports "
            f"{supported_list()}"
        )
    return fam


def for_model(model: Any) -> Family:
    """The family of a loaded mlx-lm model (by its args' model_type)."""
    args = getattr(model, "args", None)
    return family_for(str(getattr(args, "model_type", None) or getattr(model, "model_type", "")))


__all__ = [
    "FAMILIES",
    "Family",
    "Form",
    "every_family",
    "family_for",
    "for_model",
    "supported_list",
]
