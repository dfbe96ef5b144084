"""Activations with weights of their own (prelu, xielu): the checkpoint's tensors reach every
MLP and expert block, `convert` keeps them resident, a checkpoint without one is refused.

Their logits against transformers: the `-xielu` / `-prelu` variants in
tests/test_config_fidelity.py (resident) and tests/test_fidelity.py (streaming modes).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten

from edge0.cli.main import main as cli
from edge0.errors import ModelLoadError
from edge0.layout.convert import ConvertOptions, convert
from edge0.layout.manifest import RESIDENT_FILE
from edge0.model.activations import XIELU, GatedActivation, PReLU
from edge0.model.loader import load
from edge0.synth.tiny_families import fixture_file, write_family

FIXTURES = Path(__file__).parent / "fixtures"
# (variant, a dense MLP's or shared expert's tensor, the routed experts' tensor, its mlx name)
CASES = [
    (
        "qwen3_moe-xielu",
        "model.layers.0.mlp.act_fn.alpha_n",
        "model.layers.1.mlp.experts.act_fn.beta",
        "model.layers.1.mlp.switch_mlp.activation.act_fn.beta",
    ),
    (
        "qwen2_moe-prelu",
        "model.layers.2.mlp.shared_expert.act_fn.weight",
        "model.layers.2.mlp.experts.act_fn.weight",
        "model.layers.2.mlp.switch_mlp.activation.act_fn.weight",
    ),
    (  # Llama-4: a dense MLP's is `activation_fn`, the experts' `act_fn`
        "llama4-xielu",
        "language_model.model.layers.0.feed_forward.activation_fn.alpha_p",
        "language_model.model.layers.1.feed_forward.experts.act_fn.alpha_n",
        "language_model.model.layers.1.feed_forward.experts.activation.act_fn.alpha_n",
    ),
]


def _tensors(path: Path) -> dict[str, mx.array]:
    loaded = mx.load(str(path))
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize(("name", "dense", "experts", "ours"), CASES)
def test_convert_keeps_the_activation_tensors_resident(
    tmp_path: Path, name: str, dense: str, experts: str, ours: str
) -> None:
    """Every tensor of the activations is in resident.safetensors as the checkpoint holds it,
    the experts' under their SwitchGLU's activation; the layout loads them into the model."""
    hf = write_family(fixture_file(FIXTURES, name), tmp_path / "hf")
    source = _tensors(hf / "model.safetensors")
    acts = {k: v for k, v in source.items() if k.split(".")[-2] in ("act_fn", "activation_fn")}
    assert dense in acts and experts in acts
    convert(hf, tmp_path / "e0", ConvertOptions(group_size=32))
    resident = _tensors(tmp_path / "e0" / RESIDENT_FILE)
    for key, value in acts.items():
        stored = resident[_ours(key, ours)]
        assert stored.dtype == value.dtype and mx.array_equal(stored, value), key
    params = dict(tree_flatten(load(tmp_path / "e0").model.parameters()))
    assert mx.array_equal(params[ours].astype(mx.float32), source[experts].astype(mx.float32))
    weighted = PReLU if name.endswith("prelu") else XIELU
    switch = dict(load(hf).model.named_modules())[ours.split(".activation.")[0]]
    assert isinstance(switch.activation, GatedActivation)
    assert isinstance(switch.activation.act_fn, weighted)


def _ours(key: str, ours: str) -> str:
    """The model's name of a checkpoint activation tensor (as CASES' `experts` -> `ours`)."""
    switch = ours.split(".activation.")[0].rpartition(".")[2]  # switch_mlp (Llama-4: experts)
    key = key.replace(".activation_fn.", ".act_fn.")
    return key.replace(".experts.act_fn.", f".{switch}.activation.act_fn.")


@pytest.mark.parametrize(("name", "dense", "experts", "ours"), CASES)
@pytest.mark.parametrize("which", ["dense", "experts"])
def test_a_checkpoint_without_one_is_refused_naming_it(
    tmp_path: Path, name: str, dense: str, experts: str, ours: str, which: str
) -> None:
    """load, `convert` and `run`: one line naming the missing tensor; nothing written."""
    gone = dense if which == "dense" else experts
    hf = write_family(fixture_file(FIXTURES, name), tmp_path / "hf")
    file = hf / "model.safetensors"
    tensors = _tensors(file)
    del tensors[gone]
    mx.save_safetensors(str(file), tensors, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError) as info:
        load(hf)
    assert f"tensor {gone} is missing" in str(info.value) and "\n" not in str(info.value)
    for args in (
        ["convert", str(hf), str(tmp_path / "out"), "--group-size", "32"],
        ["run", str(hf), "-p", "hi", "--max-tokens", "1"],
    ):
        result = CliRunner().invoke(cli, args)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2, result.output
        assert len(lines) == 1 and lines[0].startswith("edge0: error: "), result.output
        assert f"tensor {gone} is missing" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", [case[0] for case in CASES])
def test_chunked_prefill_over_streamed_experts_decodes_as_resident(
    tmp_path: Path, name: str
) -> None:
    """A prompt prefilled 4 tokens a forward through the streamed experts (chunked prefill
    calls the SwitchGLU's activation module too) and then 1 a step: resident's tokens."""
    import asyncio

    import numpy as np
    from runtime_helpers import MockTier

    from edge0.runtime.engine.api import Engine

    hf = write_family(fixture_file(FIXTURES, name), tmp_path / "hf")
    e0 = tmp_path / "e0"
    convert(hf, e0, ConvertOptions(group_size=32))
    prompt = np.load(FIXTURES / "golden" / f"{name}.npz")["prompt_ids"].tolist()

    async def decode(**opts: object) -> list[int]:
        async with Engine.open(e0, tiers=MockTier(e0), **opts) as eng:
            return [t async for t in eng.tokens(prompt, max_tokens=8, stop=False)]

    ref = asyncio.run(decode(mode="resident"))
    for chunk in (4, 1):
        assert asyncio.run(decode(mode="reactive", prefill_chunk=chunk)) == ref, chunk
