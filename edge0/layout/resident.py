"""Write resident.safetensors: every non-expert tensor, in mlx-lm's names, one tensor at a time.

Source tensors are opened lazily (`mx.load`), renamed and transformed by the model's own
`sanitize`, cast and quantized as mlx-lm's convert would (see quant.py), then evaluated
and written one by one, so memory holds about one tensor at a time. A tensor that comes
out of `sanitize` untouched and needs no cast or quantization is copied byte for byte
(this is how MLX checkpoints are repacked bit-exactly).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from tqdm import tqdm

from edge0.families import family_for
from edge0.layout.quant import (
    cast_allowed,
    conversion_dtype,
    quant_params,
    quantize,
    quantized_shapes,
    with_resident_bits,
)
from edge0.layout.safetensors_io import (
    SafetensorsWriter,
    TensorInfo,
    mx_dtype_name,
    read_raw,
    to_raw,
)
from edge0.layout.sources import Source
from edge0.log import get_logger
from edge0.model import activations

log = get_logger(__name__)


@attrs.frozen
class _Entry:
    """One planned resident tensor (or quantized triple) and how to produce it."""

    outputs: tuple[tuple[str, str, tuple[int, ...]], ...]  # (name, dtype, shape)
    produce: Callable[[], list[np.ndarray]]


def _lazy_tensors(source: Source) -> tuple[dict[str, mx.array], dict[int, TensorInfo]]:
    """Lazy MLX arrays of the resident tensors, and id(array) -> where its bytes live."""
    by_file: dict[Path, list[str]] = {}
    for key in source.resident_keys:
        by_file.setdefault(source.tensors[key].file, []).append(key)
    lazy: dict[str, mx.array] = {}
    origin: dict[int, TensorInfo] = {}
    for file, keys in by_file.items():
        loaded = mx.load(str(file))
        assert isinstance(loaded, dict)
        for key in keys:
            lazy[key] = loaded[key]
            origin[id(loaded[key])] = source.tensors[key]
    return lazy, origin


def _plan(
    source: Source, model: nn.Module, defaults: dict[str, Any], bits: dict[str, int]
) -> tuple[list[_Entry], dict[str, Any]]:
    lazy, origin = _lazy_tensors(source)
    tc = source.config.get("text_config") or source.config
    mlx = any(le.kind == "stacked" for le in source.experts.values())
    family = family_for(str(source.config["model_type"]))
    weights = family.sanitize_resident(model, lazy, tc, mlx)
    act = family.mlp_act
    activations.check(model, activations.rename(model, weights, act), str(source.path), act)
    del lazy
    modules = dict(model.named_modules())
    cast = None if source.quantized else conversion_dtype(source.config)
    overrides: dict[str, Any] = {}
    entries: list[_Entry] = []
    for key in sorted(weights):
        value = weights.pop(key)
        info = origin.get(id(value))
        target = value.dtype
        if (
            cast is not None
            and cast_allowed(model, key)
            and mx.issubdtype(value.dtype, mx.floating)
        ):
            target = cast
        path, _, leaf = key.rpartition(".")
        params = None
        if not source.quantized and leaf == "weight" and path in modules:
            params = quant_params(model, path, modules[path], defaults)
            params = with_resident_bits(path, params, bits)
            if params is not None and params != defaults:
                overrides[path] = {k: params[k] for k in ("group_size", "bits")}
        entries.append(_entry(key, value, info, target, params))
    config = copy.deepcopy(source.config)
    if not source.quantized:
        config["quantization"] = {**defaults, **overrides}
        config["quantization_config"] = copy.deepcopy(config["quantization"])
    return entries, config


def _entry(
    key: str,
    value: mx.array,
    info: TensorInfo | None,
    target: mx.Dtype,
    params: dict[str, Any] | None,
) -> _Entry:
    shape = tuple(value.shape)
    if params is not None:
        path = key.rpartition(".")[0]
        wshape, sshape = quantized_shapes(shape, params)
        fdt = mx_dtype_name(mx.zeros((0,), dtype=target))
        outs = (
            (f"{path}.weight", "uint32", wshape),
            (f"{path}.scales", fdt, sshape),
            (f"{path}.biases", fdt, sshape),
        )

        def produce_q() -> list[np.ndarray]:
            triple = quantize(value.astype(target), params)
            mx.eval(*triple)
            return [to_raw(a) for a in triple]

        return _Entry(outs, produce_q)
    if info is not None and target == value.dtype:
        return _Entry(((key, info.dtype, shape),), lambda: [read_raw(info)])

    def produce() -> list[np.ndarray]:
        out = value.astype(target)
        mx.eval(out)
        return [to_raw(out)]

    return _Entry(((key, mx_dtype_name(mx.zeros((0,), dtype=target)), shape),), produce)


def write_resident(
    source: Source,
    model: nn.Module,
    defaults: dict[str, Any],
    path: Path,
    bits: dict[str, int] | None = None,
) -> tuple[dict[str, Any], int]:
    """Write resident.safetensors for `source`; returns (output config, bytes written).

    `model` is the float-shaped mlx-lm model of the source (never evaluated). `bits` maps
    a resident kind (quant.RESIDENT_KINDS) to its bits, overriding the defaults' (recorded
    per layer in the config's quantization dict, as the 8-bit routers are).
    """
    entries, config = _plan(source, model, defaults, bits or {})
    plan = [o for e in entries for o in e.outputs]
    writer = SafetensorsWriter(path, plan)
    total = 0
    entries.reverse()
    with tqdm(total=len(plan), desc="resident", unit="tensor", disable=None) as bar:
        while entries:
            entry = entries.pop()  # dropping it frees the evaluated source tensor
            for (name, _, _), raw in zip(entry.outputs, entry.produce(), strict=True):
                writer.write(name, raw)
                total += raw.nbytes
                bar.update(1)
    writer.close()
    log.info("resident.written", path=str(path), tensors=len(plan), bytes=total)
    return config, total
