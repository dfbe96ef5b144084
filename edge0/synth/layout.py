"""Random-weight checkpoints with the exact shapes of real models, written in the edge0 layout.

Shapes come from transformers' config classes. Resident tensors are random (bf16 where
mlx-lm's convert keeps float, int4/int8 with sane scales where it quantizes); expert
records are random packed uint32 plus scales/biases whose dequantized values have a
1/sqrt(fan_in) spread. No full-precision expert tensor is ever materialized.
`plan_sizes` gives the same shape's bytes without writing anything.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from tqdm import tqdm

from edge0.layout.atomic import atomic_directory, check_destination, check_free_space
from edge0.layout.manifest import RESIDENT_FILE, Manifest
from edge0.layout.manifest_checks import FORMAT_VERSION
from edge0.layout.model import build_float_model
from edge0.layout.quant import cast_allowed, quant_params, quantized_shapes, switch_modules
from edge0.layout.records import RecordSpec, field_views, projection_quant
from edge0.layout.safetensors_io import SafetensorsWriter
from edge0.layout.writer import RecordWriter
from edge0.log import get_logger
from edge0.synth.flagships import expert_params, expert_spec
from edge0.synth.shapes import SHAPES, shape_config

log = get_logger(__name__)
__all__ = ["SHAPES", "shape_config", "synthesize"]
POOL_WORDS = 16 * 1024 * 1024  # 64 MiB of random uint32 that packed weights are cut from


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16, round to nearest even)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@attrs.define
class Rand:
    """Fast random data: a pool of random words, sliced and xor-ed per use."""

    rng: np.random.Generator
    pool: np.ndarray = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.pool = self.rng.integers(0, 2**32, size=POOL_WORDS, dtype=np.uint32)

    def words(self, out: np.ndarray) -> None:
        """Fill a uint32 array with random words (near memory speed)."""
        flat = out.reshape(-1)
        for start in range(0, flat.size, POOL_WORDS // 2):
            n = min(POOL_WORDS // 2, flat.size - start)
            off = int(self.rng.integers(0, POOL_WORDS - n + 1))
            key = np.uint32(self.rng.integers(0, 2**32))
            np.bitwise_xor(self.pool[off : off + n], key, out=flat[start : start + n])

    def scales(
        self, shape: tuple[int, ...], fan_in: int, bits: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """float32 (scales, biases) so that dequantized weights spread ~ 1/sqrt(fan_in)."""
        levels = 2**bits - 1
        s = (6.0 / np.sqrt(fan_in) / levels) * (0.75 + 0.5 * self.rng.random(shape, np.float32))
        b = -0.5 * levels * s * (0.9 + 0.2 * self.rng.random(shape, np.float32))
        return s.astype(np.float32), b.astype(np.float32)

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return self.rng.standard_normal(shape, np.float32) * np.float32(std)


def _float_value(key: str, shape: tuple[int, ...], rand: Rand) -> np.ndarray:
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "A_log":
        return np.log(rand.rng.uniform(1.0, 16.0, shape)).astype(np.float32)
    if leaf == "dt_bias" or (len(shape) == 1 and "norm" in key):
        return np.ones(shape, np.float32)
    if len(shape) == 1:
        return np.zeros(shape, np.float32)
    fan_in = int(np.prod(shape[1:]))
    return rand.normal(shape, 1.0 / np.sqrt(fan_in))


def resident_plan(model: nn.Module, defaults: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """[(key, params or None, float shape, dtype)] for every non-expert parameter."""
    switch = tuple(f"{p}." for p, _ in switch_modules(model).values())
    modules = dict(model.named_modules())
    overrides: dict[str, Any] = {}
    plan = []
    for key, value in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        if key.startswith(switch):
            continue
        path, _, leaf = key.rpartition(".")
        params = None
        if leaf == "weight" and path in modules:
            params = quant_params(model, path, modules[path], defaults)
            if params is not None and params != defaults:
                overrides[path] = {k: params[k] for k in ("group_size", "bits")}
        dtype = "bfloat16" if cast_allowed(model, key) else "float32"
        plan.append((key, params, tuple(value.shape), dtype))  # type: ignore[union-attr]
    return plan, overrides


def _write_resident(path: Path, plan: list[Any], rand: Rand, bar: tqdm) -> int:
    outputs = []
    for key, params, shape, dtype in plan:
        if params is None:
            outputs.append((key, dtype, shape))
        else:
            p = key.rpartition(".")[0]
            w, s = quantized_shapes(shape, params)
            outputs += [
                (f"{p}.weight", "uint32", w),
                (f"{p}.scales", "bfloat16", s),
                (f"{p}.biases", "bfloat16", s),
            ]
    writer = SafetensorsWriter(path, outputs)
    total = 0
    for key, params, shape, dtype in plan:
        if params is None:
            x = _float_value(key, shape, rand)
            raws = [bf16_bits(x) if dtype == "bfloat16" else x]
        else:
            w_shape, s_shape = quantized_shapes(shape, params)
            packed = np.empty(w_shape, np.uint32)
            rand.words(packed)
            scales, biases = rand.scales(s_shape, shape[-1], params["bits"])
            raws = [packed, bf16_bits(scales), bf16_bits(biases)]
        names = (
            [key]
            if params is None
            else [f"{key.rpartition('.')[0]}.{x}" for x in ("weight", "scales", "biases")]
        )
        for name, raw in zip(names, raws, strict=True):
            writer.write(name, raw)
            total += raw.nbytes
            bar.update(raw.nbytes)
    writer.close()
    return total


def fill_record(record: np.ndarray, spec: RecordSpec, rand: Rand, quant: dict[str, Any]) -> None:
    """Random packed weights and sane scales/biases into one record buffer (padding zero)."""
    views = field_views(spec, record)
    for f in spec.fields:
        proj, part = f.name.split(".")
        bits = projection_quant(quant, proj)["bits"]
        if part == "weight":
            rand.words(views[f.name])
        elif part == "bias":  # gpt-oss experts' own biases
            views[f.name][...] = bf16_bits(rand.normal(f.shape, 0.02))
        elif part == "scales" and f.dtype == "uint8":  # mxfp4: e8m0 exponents, ~2^-7
            fan_in = views[f"{proj}.weight"].shape[1] * 32 // bits
            exp = 127 + int(np.round(np.log2(1.0 / np.sqrt(fan_in) / 3)))
            views[f.name][...] = rand.rng.integers(exp - 1, exp + 2, f.shape, dtype=np.uint8)
        elif part == "scales":
            fan_in = views[f"{proj}.weight"].shape[1] * 32 // bits
            s, b = rand.scales(f.shape, fan_in, bits)
            views[f.name][...] = bf16_bits(s)
            views[f"{proj}.biases"][...] = bf16_bits(b)


def synthesize(
    shape: str,
    dst: Path | str,
    bits: int = 4,
    group_size: int = 64,
    seed: int = 0,
    force: bool = False,
    compress: str | None = None,
    zero_experts: bool = False,
) -> Manifest:
    """Write a random edge0-layout checkpoint of a named shape into `dst`.

    `zero_experts`: every expert record all zeros, left as holes in a sparse
    experts.bin, so only the resident file takes disk (a full-size shape's memory
    figures on a disk too small for its experts; reads of holes need no disk I/O).
    """
    from edge0.synth.tiny import SPECIAL_TOKENS, build_tokenizer

    dst = Path(dst)
    check_destination(dst, force)
    config = shape_config(shape)
    model = build_float_model(config)
    defaults = {"group_size": group_size, "bits": bits, "mode": "affine"}
    experts = expert_params(shape, bits, group_size)  # MXFP4 where the release has it
    layers, n_experts, spec = expert_spec(model, experts)
    plan, overrides = resident_plan(model, defaults)
    config["quantization"] = {**defaults, **overrides}
    config["quantization_config"] = dict(config["quantization"])
    eos = SPECIAL_TOKENS.index("<|im_end|>")
    (config.get("text_config") or config)["eos_token_id"] = eos
    config["eos_token_id"] = eos
    n_records = len(layers) * n_experts
    resident_bytes = sum(_plan_bytes(p) for p in plan)
    need = (0 if zero_experts else n_records * spec.record_size) + resident_bytes
    check_free_space(dst, need, f"the {shape} checkpoint")
    start = time.perf_counter()
    rand = Rand(np.random.default_rng(seed))
    with (
        atomic_directory(dst, force) as tmp,
        tqdm(total=need, desc=f"synth {shape}", unit="B", unit_scale=True, disable=None) as bar,
    ):
        _write_resident(tmp / RESIDENT_FILE, plan, rand, bar)
        record = np.zeros(spec.record_size, np.uint8)
        level = 3 if compress == "zstd" else None
        with RecordWriter(tmp, spec.record_size, level) as writer:
            for _ in range(n_records):
                if zero_experts:
                    writer.write_hole()
                    continue
                fill_record(record, spec, rand, experts)
                writer.write(record)
                bar.update(spec.record_size)
        manifest = Manifest(
            FORMAT_VERSION,
            config["model_type"],
            config,
            dict(experts),
            layers,
            n_experts,
            spec.record_size,
            0,
            spec.fields,
            tuple(writer.crc32),
            writer.compression(),
        )
        build_tokenizer(tmp, 512)
        import json

        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        manifest.save(tmp)
    log.info(
        "synth.done",
        shape=shape,
        dst=str(dst),
        bytes=need,
        seconds=round(time.perf_counter() - start, 1),
    )
    return manifest


def _plan_bytes(entry: Any) -> int:
    key, params, shape, dtype = entry
    if params is None:
        return int(np.prod(shape)) * (2 if dtype == "bfloat16" else 4)
    w, s = quantized_shapes(shape, params)
    return int(np.prod(w)) * 4 + 2 * int(np.prod(s)) * 2


def plan_sizes(shape: str, bits: int = 4, group_size: int = 64) -> dict[str, Any]:
    """Bytes of a shape in the edge0 layout (resident file, one record, all experts), no writes."""
    config = shape_config(shape)
    model = build_float_model(config)
    layers, n_experts, spec = expert_spec(model, expert_params(shape, bits, group_size))
    plan, _ = resident_plan(model, {"group_size": group_size, "bits": bits, "mode": "affine"})
    tc = config.get("text_config") or config
    k = int(tc["num_experts_per_tok"])
    return {
        "shape": shape,
        "model_type": config["model_type"],
        "layers": int(tc["num_hidden_layers"]),
        "moe_layers": len(layers),
        "experts": int(n_experts),
        "top_k": k,
        "expert_mode": expert_params(shape, bits, group_size)["mode"],
        "record_bytes": spec.record_size,
        "resident_bytes": sum(_plan_bytes(p) for p in plan),
        "experts_bytes": len(layers) * int(n_experts) * spec.record_size,
        # streamed at the model's top-k, first MoE layer resident (the runtime's default):
        "first_layer_bytes": int(n_experts) * spec.record_size,
        "slot_bytes": 2 * k * (len(layers) - 1) * spec.record_size,
    }
