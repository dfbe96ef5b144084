"""The resident part at its smallest faithful size: kept dtypes, lean init heads, planned bytes."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from runtime_helpers import PROMPT, build_store

from edge0.layout.load import load_layout, resident_bytes
from edge0.layout.manifest import Manifest
from edge0.routing.prerouter import PrerouterSet, RouterCopyHead


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_5_moe"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("foot"), str(request.param))


def _nbytes(model: object) -> int:
    return sum(int(v.nbytes) for _, v in tree_flatten(model.parameters()))  # type: ignore[attr-defined]


def _logits(model: object, tokens: list[int]) -> list[mx.array]:
    cache = make_prompt_cache(model)
    out = []
    for tok in tokens:
        y = model(mx.array([[tok]]), cache=cache)  # type: ignore[operator]
        mx.eval(y)
        out.append(y)
    return out


def test_kept_dtypes_are_smaller_and_bit_identical_to_all_fp32(store: Path) -> None:
    lean = load_layout(store, experts="resident")
    wide = load_layout(store, experts="resident", dtype=mx.float32)
    kept = [k for k, v in tree_flatten(lean.model.parameters()) if v.dtype == mx.bfloat16]
    assert kept and all(k.rsplit(".", 1)[-1] in ("scales", "biases", "weight") for k in kept)
    assert not any(".switch_mlp." in k or "embed_tokens" in k for k in kept)
    assert _nbytes(lean.model) < _nbytes(wide.model)
    for a, b in zip(_logits(lean.model, PROMPT), _logits(wide.model, PROMPT), strict=True):
        assert a.dtype == mx.float32 and mx.array_equal(a, b).item()


def test_planned_resident_bytes_are_the_loaded_bytes(store: Path) -> None:
    manifest = Manifest.load(store)
    loaded = load_layout(store, experts="none")
    assert resident_bytes(store, manifest, mx.float32) == _nbytes(loaded.model)
    full = load_layout(store, experts="none", dtype=mx.float32)
    assert _nbytes(full.model) > _nbytes(loaded.model)


def test_lean_init_heads_predict_what_full_init_heads_do(store: Path) -> None:
    model = load_layout(store, experts="none").model
    full = PrerouterSet.from_model(model)
    lean = PrerouterSet.from_model(model, lean=True)
    assert all(isinstance(h, RouterCopyHead) for h in lean.heads.values())
    assert _nbytes_heads(lean) < _nbytes_heads(full)
    d, e = full.config.d_model, full.config.num_experts
    mx.random.seed(3)
    for layer in full.heads:
        hidden = mx.random.normal((d,))
        top = mx.array([1, 2]) % e
        a = full.predict(layer, hidden, top, top)
        b = lean.predict(layer, hidden, top, None)
        assert mx.array_equal(a, b).item()
        assert mx.array_equal(
            full.predict_topk(layer, hidden, top, None, 2),
            lean.predict_topk(layer, hidden, top, None, 2),
        ).item()


def _nbytes_heads(heads: PrerouterSet) -> int:
    return sum(_nbytes(h) for h in heads.heads.values())


def test_dequantized_copies_do_not_see_the_kept_dtype(store: Path) -> None:
    """Router copies (init heads) and LoRA merges dequantize as with all-fp32 weights."""
    from edge0.model.merge import _dequantized
    from edge0.routing.prerouter import moe_blocks, router_weight

    lean = load_layout(store, experts="none").model
    wide = load_layout(store, experts="none", dtype=mx.float32).model
    for (_, a), (_, b) in zip(moe_blocks(lean), moe_blocks(wide), strict=True):
        assert mx.array_equal(router_weight(a), router_weight(b)).item()
    lin = {k: m for k, m in lean.named_modules() if k.endswith("self_attn.o_proj")}
    ref = dict(wide.named_modules())
    assert lin
    for k, m in lin.items():
        assert mx.array_equal(_dequantized(m), _dequantized(ref[k])).item()
