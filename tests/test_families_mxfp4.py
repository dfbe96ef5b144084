"""gpt-oss in the hub's MXFP4 form: experts stay `mode="mxfp4"` from the checkpoint to the slots.

The checkpoint is the gpt_oss family fixture written as the hub release stores it
(the gpt_oss family's `gpt_oss_mxfp4` form, edge0.synth.forms); golden logits are
transformers fp32 with the MXFP4 experts dequantized (tests/fixtures/golden/gpt_oss_mxfp4.npz).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from layout_helpers import greedy
from runtime_helpers import PROMPT
from test_families import _max_err, every_mode_matches_resident
from test_reference import edge0_logits
from tool_helpers import load_tool

from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.load import load_layout
from edge0.layout.manifest import EXPERTS_FILE, Manifest
from edge0.layout.records import field_views
from edge0.layout.verify import verify
from edge0.model.loader import load
from edge0.synth.forms import derived
from edge0.synth.tiny_families import fixture_file, write_family

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    hf = write_family(fixture_file(FIXTURES, "gpt_oss"), root / "hf")
    src = derived("gpt_oss_mxfp4", hf, root / "hub")
    convert(src, root / "e0", ConvertOptions(group_size=32))
    return {"hub": src, "e0": root / "e0", "root": root}


def test_hub_form_matches_transformers(hub: dict[str, Path]) -> None:
    golden = dict(np.load(FIXTURES / "golden" / "gpt_oss_mxfp4.npz"))
    ours = edge0_logits(load(hub["hub"]), golden["prompt_ids"], golden["decode_ids"])
    assert _max_err(ours, golden) <= 1e-4
    pytest.importorskip("torch")
    tool = load_tool("tools/golden_logits.py")
    ref = tool.reference_logits(hub["hub"], tool.prompt_ids(hub["hub"]))
    assert np.array_equal(ref["decode_ids"], golden["decode_ids"])
    assert _max_err(golden, ref) <= 1e-5


def test_convert_keeps_mxfp4_records_byte_equal_to_the_hub_blocks(hub: dict[str, Path]) -> None:
    e0 = hub["e0"]
    assert verify(e0, progress=False).records == 4 * 8
    manifest = Manifest.load(e0)
    assert manifest.quantization == {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    names = [f.name for f in manifest.fields]
    assert "gate_proj.biases" not in names and manifest.field("gate_proj.scales").dtype == "uint8"
    assert manifest.field("down_proj.bias").shape == (64,)
    weights = mx.load(str(hub["hub"] / "model.safetensors"))
    blob = np.fromfile(e0 / EXPERTS_FILE, dtype=np.uint8)
    for layer, e in ((0, 0), (3, 5)):
        off = manifest.record_offset(layer, e)
        views = field_views(manifest, blob[off : off + manifest.record_size])
        pre = f"model.layers.{layer}.mlp.experts"
        gu = np.array(weights[f"{pre}.gate_up_proj_blocks"][e]).reshape(64, -1)  # (2F, d/2)
        assert views["gate_proj.weight"].view(np.uint8).tobytes() == gu[::2].tobytes()
        assert views["up_proj.weight"].view(np.uint8).tobytes() == gu[1::2].tobytes()
        sc = np.array(weights[f"{pre}.down_proj_scales"][e])
        assert np.array_equal(views["down_proj.scales"], sc)


def test_tokens_equal_mlx_lm_reading_the_hub_form(hub: dict[str, Path]) -> None:
    """mlx-lm reads the hub MXFP4 form itself; Edge0 resident and converted agree with it."""
    import mlx_lm
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    ref, _ = mlx_lm.load(str(hub["hub"]))
    ref.set_dtype(mx.float32)
    assert greedy(load(hub["hub"]).model, PROMPT, 12) == greedy(ref, PROMPT, 12)
    # mlx-lm's int4 of what is not already MXFP4 (its `convert -q` refuses a quantized model)
    model, config = load_model(hub["hub"])
    model, config = quantize_model(model, config, 32, 4, quant_predicate=model.quant_predicate)
    want = greedy(model, PROMPT, 12)
    assert greedy(load_layout(hub["e0"], dtype=None).model, PROMPT, 12) == want
    # that model saved as an mlx-community directory (`mlp.experts.*` stacks with `.bias`)
    mlx_dir = hub["root"] / "mlx-mxfp4"
    save_model(mlx_dir, model)
    save_config(config, mlx_dir / "config.json")
    shutil.copy2(hub["hub"] / "tokenizer.json", mlx_dir / "tokenizer.json")
    shutil.copy2(hub["hub"] / "tokenizer_config.json", mlx_dir / "tokenizer_config.json")
    repacked = convert(mlx_dir, hub["root"] / "e0-from-mlx")
    assert repacked.quantization["mode"] == "mxfp4"
    assert greedy(load_layout(hub["root"] / "e0-from-mlx", dtype=None).model, PROMPT, 12) == want


def test_every_mode_streams_mxfp4_experts_exactly(hub: dict[str, Path]) -> None:
    every_mode_matches_resident(hub["e0"])
