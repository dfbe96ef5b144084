"""Shared by test_examples.py and test_docs.py: subprocess environment, a tiny converted model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
BIN = Path(sys.executable).parent  # the interpreter running the tests: its `edge0` script


def subprocess_env() -> dict[str, str]:
    """os.environ (EDGE0_CACHE from conftest included) with this interpreter's bin dir on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tiny_layout(root: Path, model_type: str = "qwen3_5_moe") -> Path:
    """The committed tiny HF fixture `model_type` converted to the edge0 layout under `root`."""
    from edge0.layout.convert import ConvertOptions, convert

    out = root / f"{model_type}-edge0"
    if not (out / "edge0.json").is_file():
        convert(FIXTURES / model_type, out, ConvertOptions(group_size=32))
    return out


def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model converted in the session's cache: the EDGE0_CACHE that conftest.py sets
    for each test, which a module-scoped fixture does not see yet (it is set up first)."""
    from edge0.model.demo import default_model_path

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE0_CACHE", str(tmp_path_factory.getbasetemp() / "edge0-cache"))
        return default_model_path()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def report(res: subprocess.CompletedProcess[str]) -> str:
    """Exit code, stdout and stderr of a finished subprocess, for an assertion message."""
    return f"exit {res.returncode}\n--- stdout\n{tail(res.stdout)}\n--- stderr\n{tail(res.stderr)}"
