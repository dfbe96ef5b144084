"""Importing a script under tools/ (not a package) as a module, for the tests of its parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_tool(relative: str) -> ModuleType:
    """The module of the script at ROOT / `relative`, e.g. "tools/memcap.py"."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
