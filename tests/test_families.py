"""Every family end to end: transformers reference, convert, verify, four modes, mlx-lm int4.

Checkpoints are rebuilt from tests/fixtures/families/<model_type>.json (transformers'
config and the tensor layout its save_pretrained writes; values from the tensor
names), golden logits in tests/fixtures/golden/<model_type>.npz come from
transformers fp32 (tools/family_fixtures.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from layout_helpers import greedy, mlx_lm_int4
from runtime_helpers import PROMPT, MockTier
from test_reference import edge0_logits
from tool_helpers import load_tool

from edge0.families import family_for
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.load import load_layout
from edge0.layout.manifest import Manifest
from edge0.layout.verify import verify
from edge0.model.loader import load
from edge0.runtime.engine.api import Engine
from edge0.synth.flagships import FLAGSHIPS
from edge0.synth.tiny_families import CONFIGS, fixture_file, layout_from_transformers, write_family

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
FAMILIES = tuple(CONFIGS)
TOL = 1e-4


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """model_type -> {"hf": checkpoint, "e0": its edge0 conversion} (built once)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for mt in FAMILIES:
        hf = write_family(fixture_file(FIXTURES, mt), root / mt / "hf")
        e0 = root / mt / "e0"
        convert(hf, e0, ConvertOptions(group_size=32))
        out[mt] = {"hf": hf, "e0": e0, "root": root / mt}
    return out


def _max_err(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(ours[k] - ref[k]).max()) for k in ("prefill_logits", "decode_logits"))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_matches_golden_transformers_logits(built: dict[str, Any], model_type: str) -> None:
    golden = dict(np.load(FIXTURES / "golden" / f"{model_type}.npz"))
    loaded = load(built[model_type]["hf"])
    assert (
        loaded.tokenizer.encode(load_tool("tools/golden_logits.py").PROMPT)
        == golden["prompt_ids"].tolist()
    )
    ours = edge0_logits(loaded, golden["prompt_ids"], golden["decode_ids"])
    assert _max_err(ours, golden) <= TOL
    chain = [ours["prefill_logits"][-1].argmax(), *ours["decode_logits"][:-1].argmax(-1)]
    assert [int(t) for t in chain] == golden["decode_ids"].tolist()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_live_transformers_layout_and_logits(built: dict[str, Any], model_type: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    spec = json.loads(fixture_file(FIXTURES, model_type).read_text())
    # the committed layout is what transformers' own save_pretrained writes today
    assert [[n, list(s)] for n, s in layout_from_transformers(spec["config"])] == spec["tensors"]
    tool = load_tool("tools/golden_logits.py")
    path = built[model_type]["hf"]
    ref = tool.reference_logits(path, tool.prompt_ids(path))  # exits if keys do not match
    assert _max_err(edge0_logits(load(path), ref["prompt_ids"], ref["decode_ids"]), ref) <= TOL
    golden = dict(np.load(FIXTURES / "golden" / f"{model_type}.npz"))
    assert np.array_equal(golden["decode_ids"], ref["decode_ids"])
    assert _max_err(golden, ref) <= 1e-5


async def _decode(path: Path, n: int = 10, **opts: Any) -> tuple[list[int], Any]:
    opts.setdefault("tiers", MockTier(path))
    async with Engine.open(path, **opts) as eng:
        return [t async for t in eng.tokens(PROMPT, max_tokens=n, stop=False)], eng


@pytest.mark.parametrize("model_type", FAMILIES)
def test_convert_verify_and_every_mode_match_resident(
    built: dict[str, Any], model_type: str
) -> None:
    e0 = built[model_type]["e0"]
    report = verify(e0, progress=False)
    assert report.records == len(json.loads((e0 / "edge0.json").read_text())["moe_layers"]) * 8
    eng2 = every_mode_matches_resident(e0)
    assert eng2.setup.ctx.routed_by_prediction == 9 * len(eng2.setup.manifest.moe_layers)


def every_mode_matches_resident(e0: Path) -> Any:
    """Greedy tokens of reactive, hint (init heads), route (oracle) equal resident's."""
    ref, _ = asyncio.run(_decode(e0, mode="resident"))
    got, eng = asyncio.run(_decode(e0, mode="reactive", record_routing=True, first_layer="wrap"))
    assert got == ref
    hint, _ = asyncio.run(_decode(e0, mode="hint", predictor="init", first_layer="wrap"))
    assert hint == ref
    oracle, eng2 = asyncio.run(
        _decode(
            e0,
            mode="route",
            predictor="oracle",
            first_layer="wrap",
            recording=eng.setup.ctx.recording,
        )
    )
    assert oracle == ref
    return eng2


@pytest.mark.parametrize("model_type", FAMILIES)
def test_int4_tokens_equal_mlx_lm_int4_and_mlx_dirs_load(
    built: dict[str, Any], model_type: str
) -> None:
    import mlx_lm

    b = built[model_type]
    mlx_dir = mlx_lm_int4(_mlx_lm_readable(b), b["root"] / "mlx-int4")
    ref_model, _ = mlx_lm.load(str(mlx_dir))
    # where edge0 corrects mlx-lm's arithmetic (llama4's q/k norm eps), the same correction on
    # mlx-lm's model: what is compared is the conversion (the int4 weights), not that fix
    config = json.loads((mlx_dir / "config.json").read_text())
    family_for(model_type).adapt(ref_model, config.get("text_config") or config)
    want = greedy(ref_model, PROMPT, 12)
    assert greedy(load_layout(b["e0"], dtype=None).model, PROMPT, 12) == want
    assert greedy(load(mlx_dir).model, PROMPT, 12) == greedy(load_layout(b["e0"]).model, PROMPT, 12)
    repacked = convert(mlx_dir, b["root"] / "e0-from-mlx")  # an mlx-community style dir
    assert repacked.quantization == Manifest.load(b["e0"]).quantization  # granitemoe: down 8
    assert greedy(load_layout(b["root"] / "e0-from-mlx", dtype=None).model, PROMPT, 12) == want


def _mlx_lm_readable(b: dict[str, Path]) -> Path:
    """The checkpoint in a form mlx-lm's sanitize reads (gpt-oss: under mlx-lm's names)."""
    from edge0.synth.forms import mlx_lm_readable

    return mlx_lm_readable(b["hf"], b["root"] / "mlx-names")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_traces_and_head_training(built: dict[str, Any], model_type: str, tmp_path: Path) -> None:
    from edge0.routing.prerouter import PrerouterSet
    from edge0.train.heads import HeadTrainConfig, train_heads
    from edge0.train.traces import TraceSet, collect

    model = load(built[model_type]["hf"]).model
    win = ((np.arange(16)[:, None] * 7 + np.arange(16)[None] * 3) % 250 + 5).astype(np.int32)
    collect(model, win, tmp_path, batch=8, progress=False)
    ts = TraceSet.load(tmp_path)
    n_sparse = len(json.loads((built[model_type]["e0"] / "edge0.json").read_text())["moe_layers"])
    k = _top_k(built[model_type]["hf"])
    assert ts.topk.shape == (16, n_sparse, 16, k)
    init = PrerouterSet.from_model(model)
    cfg = HeadTrainConfig(k=k, batch=64, max_steps=30, eval_every=10, heldout_frac=0.25, lr=3e-3)
    trained, summary = train_heads(ts, init, cfg, progress=False)
    assert summary["heldout_loss"] < summary["heldout_loss_init"]
    assert trained.config.trained


def _top_k(hf: Path) -> int:
    config = json.loads((hf / "config.json").read_text())
    return int((config.get("text_config") or config)["num_experts_per_tok"])


def test_recorded_sets_follow_the_family_rule(built: dict[str, Any], tmp_path: Path) -> None:
    """Traces record what the block executes: DeepSeek-V3's bias and groups, not top-k of logits."""
    from edge0.routing.prerouter import moe_blocks
    from edge0.train.capture import run_and_record

    model = load(built["deepseek_v3"]["hf"]).model
    toks = mx.array(PROMPT)[None]
    rec = run_and_record(model, toks, np.float32)
    fam = family_for("deepseek_v3")
    for j, (_, block) in enumerate(moe_blocks(model)):
        x = mx.array(rec.hidden[:, j])
        inds, _ = block.gate(x)  # mlx-lm's own selection
        assert (np.sort(np.array(inds), -1) == rec.topk[:, j]).all()
        assert np.allclose(np.array(fam.router_logits(block, x)), rec.logits[:, j], atol=1e-6)


@pytest.mark.parametrize("model_type", ["deepseek_v3", "mixtral"])
def test_capacity_k1_streams_what_resident_computes(built: dict[str, Any], model_type: str) -> None:
    """--top-k 1 reaches the router itself (DeepSeek's gate keeps its own top_k)."""
    e0 = built[model_type]["e0"]
    ref, _ = asyncio.run(_decode(e0, mode="resident", top_k=1))
    full, _ = asyncio.run(_decode(e0, mode="resident"))
    got, eng = asyncio.run(_decode(e0, mode="reactive", top_k=1, record_routing=True))
    assert got == ref and ref != full
    oracle, _ = asyncio.run(
        _decode(e0, mode="route", top_k=1, predictor="oracle", recording=eng.setup.ctx.recording)
    )
    assert oracle == ref


@pytest.mark.parametrize("shape", ["tiny-qwen3", *FLAGSHIPS])
def test_flagship_shapes_follow_their_family_rules(shape: str) -> None:
    """Each flagship config is supported, and its family's sparse-layer rule is mlx-lm's."""
    from edge0.layout.model import build_float_model
    from edge0.layout.quant import switch_modules
    from edge0.model.arch import check_supported, sparse_layers
    from edge0.synth.shapes import shape_config

    config = shape_config(shape)
    check_supported(config, shape)
    assert sparse_layers(config) == list(switch_modules(build_float_model(config)))


def test_plan_sizes_equal_what_synthesis_writes(tmp_path: Path) -> None:
    from edge0.layout.manifest import RESIDENT_FILE
    from edge0.synth.layout import plan_sizes, synthesize

    plan = plan_sizes("tiny-qwen3", group_size=32)
    m = synthesize("tiny-qwen3", tmp_path / "t", group_size=32)
    assert plan["experts_bytes"] == m.n_records * m.record_size
    assert plan["record_bytes"] == m.record_size == Manifest.load(tmp_path / "t").record_size
    header = (tmp_path / "t" / RESIDENT_FILE).stat().st_size
    assert 0 < header - plan["resident_bytes"] < 64 * 1024  # the rest is the safetensors header


@pytest.mark.parametrize("model_type", FAMILIES)
def test_streaming_block_is_bit_identical_to_the_mlx_lm_block(
    built: dict[str, Any], model_type: str
) -> None:
    """Every sparse block of the int4 model: the streaming block computes the same bits."""
    from edge0.model.sparse import sparse_blocks
    from edge0.runtime.compute.steps import Steps
    from edge0.runtime.io.trace import Tracer
    from edge0.runtime.layers.block import StreamingMoE
    from edge0.runtime.layers.streams import LayerStream, ResidentExperts

    loaded = load_layout(built[model_type]["e0"])
    quant = Manifest.load(built[model_type]["e0"]).quantization
    d = int(loaded.text_config["hidden_size"])
    fam = family_for(model_type)
    mx.random.seed(5)
    for i, _, block in sparse_blocks(loaded.model):
        k = fam.top_k(block)
        sw = block[fam.switch_attr]
        views = {
            f"{p}.{q}": sw[p][q]
            for p in ("gate_proj", "up_proj", "down_proj")
            for q in ("weight", "scales", "biases", "bias")
            if q in sw[p]
        }
        stream = LayerStream(i, Steps("reactive", k, Tracer()), ResidentExperts(views), quant)
        streaming = StreamingMoE(block, i, fam, stream)
        for _ in range(4):
            x = mx.random.normal((1, 1, d)) * 2
            assert mx.array_equal(streaming(x), block(x)).item(), (model_type, i)
            scores = fam.scores(block, x)
            inds, w = fam.select(block, scores, k)
            assert mx.array_equal(fam.weights(block, scores, inds), w).item()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_init_heads_are_the_next_router_bias_included(
    built: dict[str, Any], model_type: str, tmp_path: Path
) -> None:
    """An untrained head is the target layer's router on this layer's hidden (gpt-oss: + bias),
    lean or full, and saved heads keep the bias."""
    from edge0.routing.prerouter import PrerouterSet, moe_blocks

    model = load(built[model_type]["hf"]).model
    fam = family_for(model_type)
    blocks = dict(moe_blocks(model))
    lean = PrerouterSet.from_model(model, lean=True)
    assert lean.config.router_bias == (model_type == "gpt_oss")
    full = PrerouterSet.from_model(model)
    full.save(tmp_path)
    loaded = PrerouterSet.load(tmp_path)
    mx.random.seed(3)
    for owner, target in lean.config.heads():
        x = mx.random.normal((1, 1, lean.config.d_model))
        want = fam.router_logits(blocks[target], x)
        for heads in (lean, full, loaded):
            got = heads.predict(owner, x, None, None)
            assert np.allclose(np.array(got), np.array(want), atol=1e-5), (model_type, owner)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_native_kernels_and_mlx_ops_decode_the_same_tokens(
    built: dict[str, Any], model_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resident and route (init heads) greedy tokens are the same with the native CPU
    kernels (edge0.kernels) and with MLX's own ops; the other modes equal resident
    (test_convert_verify_and_every_mode_match_resident runs with the native kernels)."""
    from edge0.kernels import native

    e0 = built[model_type]["e0"]

    def decode_modes() -> list[list[int]]:
        opts: list[dict[str, Any]] = [
            {"mode": "resident"},
            {"mode": "route", "predictor": "init", "first_layer": "wrap"},
        ]
        return [asyncio.run(_decode(e0, **o))[0] for o in opts]

    assert native.module() is not None, native.status()
    with_native = decode_modes()
    monkeypatch.setenv("EDGE0_NATIVE_KERNELS", "0")
    native.reset()
    try:
        assert native.module() is None
        with_mlx = decode_modes()
    finally:
        monkeypatch.delenv("EDGE0_NATIVE_KERNELS")
        native.reset()
    assert with_native == with_mlx
