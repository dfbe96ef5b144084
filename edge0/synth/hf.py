"""Random bf16 Hugging Face checkpoints of a named shape (input for `edge0 convert` tests).

Tensor names and layouts follow the released checkpoints: one tensor per expert
projection, or, where the family's releases fuse them (`Family.hub_fused`), the
"model.language_model." prefix, fused experts (gate_up_proj (E, 2*ff, d), down_proj
(E, d, ff)), conv1d weights (C, 1, K) and zero-centred RMSNorm weights. Written tensor
by tensor, in shards.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from mlx.utils import tree_flatten
from tqdm import tqdm

from edge0.errors import ConversionError
from edge0.families import family_for
from edge0.layout.atomic import atomic_directory
from edge0.layout.model import build_float_model
from edge0.layout.quant import switch_modules
from edge0.layout.safetensors_io import SafetensorsWriter
from edge0.synth.layout import Rand, bf16_bits, shape_config

MAX_HF_BYTES = 16 * 10**9
SHARD_BYTES = 2 * 10**9
_SHIFTED_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)

CHUNK_ELEMS = 1 << 24  # generate big tensors 16M values at a time


@attrs.frozen
class Normal:
    """Gaussian values of a given shape and std, generated a few rows at a time."""

    shape: tuple[int, ...]
    std: float

    def into(self, rand: Rand, out: np.ndarray) -> None:
        """Fill `out` (uint16, this shape) with bfloat16 bits."""
        row = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        step = max(1, CHUNK_ELEMS // row)
        for a in range(0, self.shape[0], step):
            b = min(a + step, self.shape[0])
            out[a:b] = bf16_bits(rand.normal((b - a, *self.shape[1:]), self.std))


Producer = Callable[[], np.ndarray] | Normal


def _tensors(config: dict[str, Any], rand: Rand) -> Iterator[tuple[str, tuple[int, ...], Producer]]:
    """(HF name, shape, producer of float32 values) for every tensor of the checkpoint."""
    model = build_float_model(config)
    fused = family_for(str(config["model_type"])).hub_fused
    switch = {p: layer for layer, (p, _) in switch_modules(model).items()}
    for key, value in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        shape = tuple(value.shape)  # type: ignore[union-attr]
        path, _, leaf = key.rpartition(".")
        prefix = path.rpartition(".switch_mlp")[0]
        if prefix and f"{prefix}.switch_mlp" in switch:
            yield from _experts(key, shape, fused, rand)
            continue
        name = _hf_name(key) if fused else key
        if fused and key.endswith("conv1d.weight"):  # mlx (C, K, 1) -> HF (C, 1, K)
            shape = (shape[0], shape[2], shape[1])
        yield name, shape, _float(name, shape, fused, rand)


def _hf_name(key: str) -> str:
    if key.startswith("language_model.model."):
        return "model.language_model." + key[len("language_model.model.") :]
    return key[len("language_model.") :] if key.startswith("language_model.") else key


def _experts(key: str, shape: tuple[int, ...], fused: bool, rand: Rand) -> Iterator[Any]:
    n, out_d, in_d = shape
    mlp = key.split(".switch_mlp.")[0]
    proj = key.split(".switch_mlp.")[1].split(".")[0]
    std = 1.0 / np.sqrt(in_d)
    if not fused:
        for e in range(n):
            yield (
                f"{mlp}.experts.{e}.{proj}.weight",
                (out_d, in_d),
                Normal((out_d, in_d), std),
            )
    elif proj == "gate_proj":  # gate_up_proj carries gate (first half) and up
        yield (
            f"{_hf_name(mlp)}.experts.gate_up_proj",
            (n, 2 * out_d, in_d),
            Normal((n, 2 * out_d, in_d), std),
        )
    elif proj == "down_proj":
        yield f"{_hf_name(mlp)}.experts.down_proj", shape, Normal(shape, std)


def _float(name: str, shape: tuple[int, ...], fused: bool, rand: Rand) -> Producer:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":
        return lambda: np.log(rand.rng.uniform(1.0, 16.0, shape)).astype(np.float32)
    if len(shape) == 1 and fused and name.endswith(_SHIFTED_NORMS):
        return Normal(shape, 0.05)  # zero-centred: the model multiplies by 1 + w
    if len(shape) == 1:
        ones = leaf == "dt_bias" or "norm" in name
        return lambda: np.ones(shape, np.float32) if ones else np.zeros(shape, np.float32)
    return Normal(shape, 1.0 / np.sqrt(int(np.prod(shape[1:]))))


def write_hf(shape: str, dst: Path, seed: int = 0, shards: int = 0, force: bool = False) -> int:
    """Write a random bf16 HF checkpoint of `shape` into `dst`; returns bytes written."""
    from edge0.synth.tiny import SPECIAL_TOKENS, build_tokenizer

    config = shape_config(shape)
    eos = SPECIAL_TOKENS.index("<|im_end|>")
    (config.get("text_config") or config)["eos_token_id"] = eos
    rand = Rand(np.random.default_rng(seed))
    tensors = list(_tensors(config, rand))
    total = sum(int(np.prod(s)) * 2 for _, s, _ in tensors)
    if total > MAX_HF_BYTES:
        raise ConversionError(
            f"an HF checkpoint of {shape} would take {total / 1e9:.0f} GB; "
            f"--format hf is for shapes under {MAX_HF_BYTES / 1e9:.0f} GB"
        )
    per_shard = -(-total // shards) if shards > 0 else SHARD_BYTES
    groups: list[list[Any]] = [[]]
    size = 0
    for t in tensors:
        nbytes = int(np.prod(t[1])) * 2
        if groups[-1] and size + nbytes > per_shard:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += nbytes
    with (
        atomic_directory(Path(dst), force) as tmp,
        tqdm(total=total, desc=f"hf {shape}", unit="B", unit_scale=True, disable=None) as bar,
    ):
        weight_map = {}
        for i, group in enumerate(groups):
            fname = (
                "model.safetensors"
                if len(groups) == 1
                else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
            )
            writer = SafetensorsWriter(
                tmp / fname, [(n, "bfloat16", s) for n, s, _ in group], metadata={"format": "pt"}
            )
            for name, shape_, produce in group:
                if isinstance(produce, Normal):
                    raw = np.empty(shape_, np.uint16)
                    produce.into(rand, raw)
                else:
                    raw = bf16_bits(produce())
                writer.write(name, raw)
                weight_map[name] = fname
                bar.update(raw.nbytes)
            writer.close()
        if len(groups) > 1:
            index = {
                "metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items())),
            }
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        build_tokenizer(tmp, 512)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return total
