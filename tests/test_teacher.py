"""The shipped demo teacher: edge0.load works, logits match transformers, greedy is stable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from safetensors import safe_open
from tool_helpers import load_tool

ROOT = Path(__file__).resolve().parent.parent
TEACHER = ROOT / "edge0" / "data" / "teacher"
GOLDEN = ROOT / "tests" / "fixtures" / "teacher_golden.npz"
TOL = 1e-4
MAX_BYTES = 64 * 2**20

_CACHE: dict[str, Any] = {}


def _teacher() -> Any:
    if "teacher" not in _CACHE:
        from edge0.model.loader import load

        _CACHE["teacher"] = load(TEACHER)
    return _CACHE["teacher"]


def _golden() -> dict[str, np.ndarray]:
    return dict(np.load(GOLDEN))


def edge0_logits(loaded: Any, prompt_ids: np.ndarray, decode_ids: np.ndarray) -> dict[str, Any]:
    """Last prompt position + one decode step per `decode_ids` token through the cache."""
    cache = make_prompt_cache(loaded.model)
    prefill = loaded.model(mx.array(prompt_ids)[None], cache=cache)[0, -1]  # (V,)
    steps = [loaded.model(mx.array([[int(t)]]), cache=cache)[0, -1] for t in decode_ids]
    mx.eval(prefill, steps)
    return {
        "last_logits": np.array(prefill),
        "decode_logits": np.stack([np.array(s) for s in steps]),
    }


def _check(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    for key in ("last_logits", "decode_logits"):
        assert ours[key].shape == ref[key].shape
        err = float(np.abs(ours[key] - ref[key]).max())
        assert err <= TOL, f"{key}: max abs error {err:.2e} > {TOL:.0e}"
    nxt = [ours["last_logits"].argmax(), *ours["decode_logits"][:-1].argmax(-1)]
    assert [int(t) for t in nxt] == ref["decode_ids"].tolist()


def test_teacher_files_and_shape() -> None:
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (TEACHER / name).is_file(), name
    total = sum(f.stat().st_size for f in TEACHER.iterdir())
    assert total <= MAX_BYTES, f"shipped teacher is {total / 2**20:.1f} MiB"
    cfg = json.loads((TEACHER / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe"
    assert cfg["num_experts"] >= 16 and cfg["num_experts_per_tok"] >= 4
    n_params = 0
    with safe_open(str(TEACHER / "model.safetensors"), "np") as f:
        for k in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            t = f.get_slice(k)
            assert t.get_dtype() == "BF16", k
            n_params += int(np.prod(t.get_shape()))
    assert 20e6 <= n_params <= 40e6


def test_teacher_loads_with_edge0() -> None:
    loaded = _teacher()
    assert loaded.source_format == "hf"
    assert loaded.config["model_type"] == "qwen3_moe"
    assert loaded.tokenizer.eos_token == "<|endoftext|>"
    golden = _golden()
    assert (
        loaded.tokenizer.encode(load_tool("tools/teacher_golden.py").PROMPT)
        == golden["prompt_ids"].tolist()
    )


def test_teacher_matches_golden_logits() -> None:
    golden = _golden()
    assert golden["decode_ids"].shape == (8,)
    _check(edge0_logits(_teacher(), golden["prompt_ids"], golden["decode_ids"]), golden)


def test_teacher_greedy_generation_is_stable() -> None:
    from edge0.model.generate import SamplingSettings, generate

    golden = _golden()
    expected = golden["greedy_ids"].tolist()
    settings = SamplingSettings(max_tokens=len(expected), temp=0.0)
    pieces = list(generate(_teacher(), golden["prompt_ids"].tolist(), settings))
    tokens = [p.token for p in pieces if p.token is not None]
    assert tokens == expected
    text = "".join(p.text for p in pieces)
    assert text == _teacher().tokenizer.decode(expected)


def test_teacher_matches_live_transformers() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    tool = load_tool("tools/teacher_golden.py")
    ref = tool.reference(TEACHER)
    _check(edge0_logits(_teacher(), ref["prompt_ids"], ref["decode_ids"]), ref)
    golden = _golden()
    for key in ("prompt_ids", "decode_ids", "greedy_ids"):
        assert np.array_equal(golden[key], ref[key]), key
