"""edge0/model/rope.py: every rope_type's frequencies and attention factor as transformers'
ROPE_INIT_FUNCTIONS compute them, and the MLX module rotating with them.

The frequencies are checked against transformers live when torch is installed, and always
against tests/fixtures/rope_golden.json (written from transformers by
`tools/family_fixtures.py --rope`). The module is checked against a numpy rotation with
those frequencies (transformers' rotate_half or interleaved pairs, cos and sin scaled by
the attention factor).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from edge0.families.probes import ROPES, YARN, longrope
from edge0.model.rope import Rope, inv_freq

GOLDEN = Path(__file__).parent / "fixtures" / "rope_golden.json"
HEAD, MAX_POS = 16, 64
SEQ_LENS = (None, 10, 100)  # at init; inside the original context; past it (dynamic, longrope)
CASES: dict[str, dict[str, Any]] = {
    **{kind: dict(rope) for kind, rope in ROPES.items()},
    "longrope-pairs": longrope(pairs=HEAD // 2),
    "longrope-attention": longrope(pairs=HEAD // 2, attention_factor=1.5),
    "yarn-mscale": dict(YARN, mscale=0.707),
    "yarn-mscales": dict(YARN, mscale=1.0, mscale_all_dim=0.8),
    "yarn-untruncated": dict(YARN, truncate=False),
    "yarn-attention": dict(YARN, attention_factor=2.0),
    "yarn-betas": dict(YARN, beta_fast=8, beta_slow=2),
    "proportional": {"rope_type": "proportional", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
}


def transformers_inv_freq(rope: dict[str, Any], seq_len: int | None) -> tuple[list[float], float]:
    """transformers' ROPE_INIT_FUNCTIONS for a head of HEAD features (needs torch)."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.Qwen3MoeConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=HEAD,
        max_position_embeddings=MAX_POS,
        rope_parameters=dict(rope),
    )
    inv, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu", seq_len=seq_len)
    return [float(v) for v in inv.numpy()], float(factor)


def golden_table() -> dict[str, Any]:
    """Every case and sequence length, as transformers computes it (needs torch)."""
    return {
        f"{name}@{seq}": transformers_inv_freq(rope, seq)
        for name, rope in CASES.items()
        for seq in SEQ_LENS
    }


def _dims(rope: dict[str, Any]) -> int:
    return HEAD  # proportional keeps the whole head; the others rotate it whole here


@pytest.mark.parametrize("name", sorted(CASES))
def test_inverse_frequencies_are_transformers(name: str) -> None:
    table = json.loads(GOLDEN.read_text())
    for seq in SEQ_LENS:
        want, factor = table[f"{name}@{seq}"]
        got, ours = inv_freq(CASES[name], _dims(CASES[name]), MAX_POS, seq)
        assert np.allclose(got, want, rtol=1e-6, atol=0), (name, seq)
        assert ours == pytest.approx(factor, rel=1e-12), (name, seq)


def test_the_golden_table_is_transformers_today() -> None:
    pytest.importorskip("torch")
    assert json.loads(GOLDEN.read_text()) == json.loads(json.dumps(golden_table()))


def _rotate(x: np.ndarray, inv: np.ndarray, factor: float, pos: np.ndarray, pairs: bool) -> Any:
    """transformers' rotation of x (..., T, HEAD) at positions pos (T,), in float64."""
    angles = pos[:, None] * inv[None, :]  # (T, HEAD/2)
    cos, sin = np.cos(angles) * factor, np.sin(angles) * factor
    if pairs:  # interleaved (x0, x1), (x2, x3), ...
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out
    a, b = x[..., : HEAD // 2], x[..., HEAD // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("name", ["linear", "yarn-attention", "llama3", "dynamic", "longrope"])
def test_the_module_rotates_as_transformers(name: str, pairs: bool) -> None:
    """q or k (1, heads, T, HEAD) at offset 5: the module against numpy with transformers'
    frequencies for that forward (dynamic and longrope: from its last position + 1)."""
    rope = CASES["longrope-pairs"] if name == "longrope" else CASES[name]
    rng = np.random.default_rng(0)
    for offset, t in ((5, 4), (60, 20)):  # inside / past the 16 original positions and 64 max
        x = rng.standard_normal((1, 2, t, HEAD)).astype(np.float32)
        got = np.array(Rope(HEAD, rope, MAX_POS, pairs)(mx.array(x), offset=offset))
        inv, factor = inv_freq(rope, HEAD, MAX_POS, seq_len=offset + t)
        want = _rotate(
            x.astype(np.float64), inv.astype(np.float64), factor, offset + np.arange(t), pairs
        )
        assert np.abs(got - want).max() < 1e-4, (name, pairs, offset)


def test_batch_rows_each_take_their_own_length() -> None:
    """A batch's rows (an offset per row) rotate as each row alone (dynamic: per-row length)."""
    module = Rope(HEAD, CASES["dynamic"], 16, False)
    x = mx.array(np.random.default_rng(1).standard_normal((2, 2, 1, HEAD)).astype(np.float32))
    batched = module(x, offset=mx.array([3, 40]))
    alone = [module(x[i : i + 1], offset=o) for i, o in enumerate((3, 40))]
    assert mx.array_equal(batched, mx.concatenate(alone)).item()
