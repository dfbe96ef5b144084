"""Tiny random checkpoints of every supported family, in the tensor layout transformers writes.

A fixture is (config, tensor layout): the config comes from transformers' own config
class, the layout (names and shapes) from transformers' `save_pretrained` of that
config (needs torch; `layout_from_transformers`). Values are a pure function of the
tensor name, so `write_family` rebuilds the same checkpoint byte for byte from the
committed fixture (tests/fixtures/families/<model_type>.json) without torch.
"""

from __future__ import annotations

import json
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from edge0.families import Family, every_family, family_for
from edge0.synth.tiny import build_tokenizer

TOKENIZER_VOCAB = 300

# model_type -> its tiny config (vocab -> a transformers config): every family's own
BASES: dict[str, Callable[[int], Any]] = {
    f.name: f.tiny for f in every_family() if type(f).tiny is not Family.tiny
}
# the family fixtures committed as tests/fixtures/families/<model_type>.json
CONFIGS: dict[str, Callable[[int], Any]] = {
    name: tiny for name, tiny in BASES.items() if family_for(name).family_fixture
}


def reference_type(model_type: str) -> str:
    """The model_type transformers builds the reference as (kimi_k2: deepseek_v3)."""
    return family_for(model_type).config_types.get(model_type, model_type)


def config_dict(
    model_type: str, vocab: int, changes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """config.json of the tiny `model_type` checkpoint (transformers' to_dict, bf16).

    `changes` (a variant's config values; "text_config.KEY" reaches into a nested text
    config) are applied, then the dict goes through transformers' config class again so
    the values it derives from them (e.g. `sliding_window` from `use_sliding_window`) follow.
    """
    out: dict[str, Any] = BASES[model_type](vocab).to_dict()
    if changes:
        import transformers

        for key, value in changes.items():
            owner = out
            *path, leaf = key.split(".")
            for step in path:
                owner = owner[step]
            owner[leaf] = value
        ref = dict(out, model_type=reference_type(model_type))
        out = transformers.AutoConfig.for_model(**ref).to_dict()
    out["dtype"] = "bfloat16"
    out["model_type"] = model_type
    return out


def layout_from_transformers(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and shapes of transformers' own `save_pretrained` of `config` (torch)."""
    import torch
    import transformers
    from safetensors import safe_open

    model_type = config["model_type"]
    config = dict(config, model_type=reference_type(model_type))
    cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    cls = getattr(transformers, family_for(model_type).reference_class)
    model = cls.from_config(cfg) if hasattr(cls, "from_config") else cls._from_config(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        with safe_open(str(Path(tmp) / "model.safetensors"), "pt") as f:
            return sorted((k, tuple(f.get_slice(k).get_shape())) for k in f.keys())


def values(
    name: str, shape: tuple[int, ...], centred: bool = False, tied: bool = False
) -> np.ndarray:
    """Deterministic float32 values of one tensor, from its name alone (and whether the
    embedding is the output head too: then it has the head's scale, so the logits keep
    theirs and the fp32 references' noise stays under the 1e-4 bar)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    z = rng.standard_normal(shape).astype(np.float32)
    if name.endswith("_fn.beta"):  # xIELU's scalars: beta near its 0.5, eps its -1e-6
        return np.asarray(0.5 + 0.1 * z, dtype=np.float32)
    if name.endswith("_fn.eps"):
        return np.asarray(-1e-6, dtype=np.float32)
    if len(shape) == 1:
        if "norm" in name and not (centred and not name.endswith("linear_attn.norm.weight")):
            return 1.0 + 0.1 * z
        return 0.1 * z
    gain = 1.0
    routers = (
        "mlp.gate.weight",
        "block_sparse_moe.gate.weight",
        "router.weight",
        "router.layer.weight",
    )
    if name.endswith(routers):
        gain = 2.0  # decisive routing: no near-ties between fp32 implementations
    elif name.endswith("experts.gate_up_proj"):
        gain = 6.0  # gpt-oss: pre-activations past swiglu_limit, so the clamps take effect
    elif name.endswith("lm_head.weight"):
        gain = 1.5
    elif name.endswith("embed_tokens.weight") and not tied:
        return z
    elif name.endswith("embed_tokens.weight"):
        gain = 1.5
    return z * (gain / np.sqrt(shape[-1]))


def fixture_file(root: Path, model_type: str) -> Path:
    return root / "families" / f"{model_type}.json"


def variant_spec(model_type: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """`model_type`'s fixture with config `changes`: config and transformers' layout (torch)."""
    with tempfile.TemporaryDirectory() as tmp:
        vocab = build_tokenizer(Path(tmp), TOKENIZER_VOCAB)
    config = config_dict(model_type, vocab, changes)
    layout = layout_from_transformers(config)
    return {"config": config, "tensors": [[n, list(s)] for n, s in layout]}


def write_fixture(
    root: Path, model_type: str, changes: dict[str, Any] | None = None, name: str | None = None
) -> Path:
    """Write tests/fixtures/families/<name>.json (config + transformers' layout)."""
    out = fixture_file(root, name or model_type)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(variant_spec(model_type, changes), indent=1) + "\n")
    return out


def write_variant(model_type: str, changes: dict[str, Any], out: Path) -> Path:
    """The tiny checkpoint of `model_type` with config `changes` in `out` (torch)."""
    return write_spec(variant_spec(model_type, changes), out)


def write_family(fixture: Path, out: Path) -> Path:
    """Write the tiny checkpoint of a committed fixture into `out` (bf16, tokenizer, config)."""
    return write_spec(json.loads(fixture.read_text()), out)


def write_spec(spec: dict[str, Any], out: Path) -> Path:
    """Write the checkpoint of a fixture spec ({"config", "tensors"}) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out, TOKENIZER_VOCAB)
    config = spec["config"]
    if vocab != (config.get("text_config") or config)["vocab_size"]:
        raise ValueError(f"{out}: tokenizer has {vocab} tokens, not the config's vocab_size")
    family = family_for(config["model_type"])
    centred, tied = family.centred_norms, family.ties(config)
    tensors = {
        name: mx.array(values(name, tuple(shape), centred, tied)).astype(mx.bfloat16)
        for name, shape in spec["tensors"]
    }
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
