"""Shared test fixtures: the committed tiny checkpoints (tests/fixtures/) and their models.

- `qwen3_moe_path`, `qwen3_5_moe_path`: the committed HF checkpoint directories
  (read-only: copy them with `model_copy` before changing anything).
- `tiny_model_path`: parametrised over both architectures.
- `model_copy(model_type)`: a writable copy under tmp_path.
- `loaded_model(model_type)`: `edge0.load` of a fixture, cached for the session.
- `runtime_store_root`, `runtime_stores`: tiny random stores in the edge0 layout
  (runtime_helpers.build_store), built once per session and shared read-only by
  the runtime tests; a test that writes into a store builds its own.
- `mlx_only`: the native kernels switched off (`EDGE0_NATIVE_KERNELS=0`) for one test.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
MODEL_TYPES = ("qwen3_moe", "qwen3_5_moe")


@pytest.fixture(scope="session")
def qwen3_moe_path() -> Path:
    return FIXTURES / "qwen3_moe"


@pytest.fixture(scope="session")
def qwen3_5_moe_path() -> Path:
    return FIXTURES / "qwen3_5_moe"


@pytest.fixture(params=MODEL_TYPES)
def tiny_model_path(request: pytest.FixtureRequest) -> Path:
    return FIXTURES / str(request.param)


@pytest.fixture
def model_copy(tmp_path: Path) -> Callable[[str], Path]:
    def copy(model_type: str) -> Path:
        target = tmp_path / model_type
        shutil.copytree(FIXTURES / model_type, target)
        return target

    return copy


@pytest.fixture(scope="session")
def runtime_store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runtime-stores")


@pytest.fixture(scope="session")
def runtime_stores(runtime_store_root: Path) -> dict[str, Path]:
    """The default tiny store of each family, keyed by model_type. Read-only."""
    from runtime_helpers import build_store

    return {mt: build_store(runtime_store_root, mt) for mt in MODEL_TYPES}


_LOADED: dict[str, Any] = {}


@pytest.fixture(scope="session")
def loaded_model() -> Callable[[str], Any]:
    """Load a fixture once per session. Do not modify the returned model."""
    from edge0.model.loader import load

    def get(model_type: str) -> Any:
        if model_type not in _LOADED:
            _LOADED[model_type] = load(FIXTURES / model_type)
        return _LOADED[model_type]

    return get


@pytest.fixture(autouse=True)
def _edge0_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # The demo model is built into EDGE0_CACHE; keep tests away from ~/.cache.
    monkeypatch.setenv("EDGE0_CACHE", str(tmp_path_factory.getbasetemp() / "edge0-cache"))


@pytest.fixture
def mlx_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from edge0.kernels import native

    monkeypatch.setenv("EDGE0_NATIVE_KERNELS", "0")
    native.reset()
    yield
    monkeypatch.delenv("EDGE0_NATIVE_KERNELS")
    native.reset()
