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
from edge0.layout.quant import switch_modules
from edge0.options.engine import EngineOptions
from edge0.routing.prerouter import PrerouterSet, RouterCopyHead
from edge0.runtime.plan.footprint import footprint
from edge0.runtime.setup.prepare import resident_stacks


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


@pytest.mark.parametrize("kernels", ["native", "mlx"])
def test_kept_dtypes_are_smaller_and_bit_identical_to_all_fp32(
    store: Path, kernels: str, request: pytest.FixtureRequest
) -> None:
    """The expert stacks keep the checkpoint's bf16 scales and biases where the native expert
    FFN reads them; MLX's gather_qmm would widen every expert per call, so they are widened
    once at load when only MLX's ops run. Either way the logits are the all-fp32 model's."""
    if kernels == "mlx":
        request.getfixturevalue("mlx_only")
    lean = load_layout(store, experts="resident")
    wide = load_layout(store, experts="resident", dtype=mx.float32)
    kept = [k for k, v in tree_flatten(lean.model.parameters()) if v.dtype == mx.bfloat16]
    assert kept and all(k.rsplit(".", 1)[-1] in ("scales", "biases", "weight") for k in kept)
    assert not any("embed_tokens" in k for k in kept)
    stacks = [k for k, _ in tree_flatten(lean.model.parameters()) if ".switch_mlp." in k]
    narrow = {k for k in stacks if k.rsplit(".", 1)[-1] in ("scales", "biases")}
    assert len(narrow) == 6 * len(switch_modules(lean.model))  # gate, up, down
    assert narrow <= set(kept) if kernels == "native" else not narrow & set(kept)
    assert _nbytes(lean.model) < _nbytes(wide.model)
    for a, b in zip(_logits(lean.model, PROMPT), _logits(wide.model, PROMPT), strict=True):
        assert a.dtype == mx.float32 and mx.array_equal(a, b).item()


def test_planned_resident_bytes_are_the_loaded_bytes(store: Path) -> None:
    manifest = Manifest.load(store)
    loaded = load_layout(store, experts="none")
    assert resident_bytes(store, manifest, mx.float32) == _nbytes(loaded.model)
    full = load_layout(store, experts="none", dtype=mx.float32)
    assert _nbytes(full.model) > _nbytes(loaded.model)


@pytest.mark.parametrize("kernels", ["native", "mlx"])
def test_planned_resident_experts_are_the_loaded_stacks(
    store: Path, kernels: str, request: pytest.FixtureRequest
) -> None:
    """The memory plan counts the expert stacks at the dtypes the load keeps: resident mode's
    every layer and `--first-layer resident`'s first one."""
    if kernels == "mlx":
        request.getfixturevalue("mlx_only")
    manifest = Manifest.load(store)
    loaded = load_layout(store, experts="resident")
    stacks = sum(
        int(v.nbytes) for k, v in tree_flatten(loaded.model.parameters()) if ".switch_mlp." in k
    )
    every = footprint(store, manifest, EngineOptions(mode="resident"), 0).resident_experts
    assert every == stacks
    first = resident_stacks(store, manifest, manifest.moe_layers[0])
    one = footprint(store, manifest, EngineOptions(first_layer="resident"), 0).resident_experts
    assert one == sum(int(v.nbytes) for v in first.values()) == stacks // len(manifest.moe_layers)
    scales = {v.dtype for k, v in first.items() if k.endswith(("scales", "biases"))}
    assert scales == {mx.bfloat16 if kernels == "native" else mx.float32}


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
