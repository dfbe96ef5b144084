"""Edge0's logits equal transformers' fp32 reference within 1e-4 (prefill + 8 cached steps)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from tool_helpers import load_tool

TOL = 1e-4
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MODEL_TYPES = ("qwen3_moe", "qwen3_5_moe")


def edge0_logits(
    loaded: Any, prompt_ids: np.ndarray, decode_ids: np.ndarray
) -> dict[str, np.ndarray]:
    """Prefill the prompt, then feed `decode_ids` one at a time through mlx-lm's cache."""
    cache = make_prompt_cache(loaded.model)
    prefill = loaded.model(mx.array(prompt_ids)[None], cache=cache)[0]  # (T, V)
    steps = []
    for token in decode_ids:
        steps.append(loaded.model(mx.array([[int(token)]]), cache=cache)[0, -1])  # (V,)
    mx.eval(prefill, steps)
    return {
        "prefill_logits": np.array(prefill),
        "decode_logits": np.stack([np.array(s) for s in steps]),
    }


def _check(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    for key in ("prefill_logits", "decode_logits"):
        assert ours[key].shape == ref[key].shape
        err = float(np.abs(ours[key] - ref[key]).max())
        assert err <= TOL, f"{key}: max abs error {err:.2e} > {TOL:.0e}"
    # The greedy chain agrees too: each decode id is the argmax of the previous logits.
    ours_next = [ours["prefill_logits"][-1].argmax(), *ours["decode_logits"][:-1].argmax(-1)]
    assert [int(t) for t in ours_next] == [int(t) for t in ref["decode_ids"]]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_matches_golden_transformers_logits(
    model_type: str, loaded_model: Callable[[str], Any]
) -> None:
    golden = dict(np.load(FIXTURES / "golden" / f"{model_type}.npz"))
    loaded = loaded_model(model_type)
    # The golden prompt is the fixed text through the fixture's own tokenizer.
    prompt = load_tool("tools/golden_logits.py").PROMPT
    assert loaded.tokenizer.encode(prompt) == golden["prompt_ids"].tolist()
    assert golden["decode_ids"].shape == (8,)
    _check(edge0_logits(loaded, golden["prompt_ids"], golden["decode_ids"]), golden)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_matches_live_transformers(model_type: str, loaded_model: Callable[[str], Any]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    tool = load_tool("tools/golden_logits.py")
    path = FIXTURES / model_type
    ref = tool.reference_logits(path, tool.prompt_ids(path))
    _check(edge0_logits(loaded_model(model_type), ref["prompt_ids"], ref["decode_ids"]), ref)
    # The committed golden file still matches the live reference.
    golden = dict(np.load(FIXTURES / "golden" / f"{model_type}.npz"))
    assert np.array_equal(golden["decode_ids"], ref["decode_ids"])
    assert float(np.abs(golden["decode_logits"] - ref["decode_logits"]).max()) <= 1e-5
