"""Open an edge0-layout directory as an mlx-lm model: `load_layout(path, experts=...)`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.switch_layers import QuantizedSwitchLinear

from edge0.errors import CheckpointError, Edge0Error
from edge0.kernels.layers import native_experts
from edge0.layout.crc import crc32
from edge0.layout.files import check_files, check_resident_header
from edge0.layout.manifest import (
    EXPERTS_FILE,
    MANIFEST_FILE,
    RESIDENT_FILE,
    Manifest,
    check_model,
)
from edge0.layout.model import build_float_model
from edge0.layout.quant import quantize_stored, switch_modules
from edge0.layout.records import PROJECTIONS, field_views, projection_quant
from edge0.layout.safetensors_io import MX_DTYPES, read_header
from edge0.log import get_logger
from edge0.model.loaded import LoadedModel, activation_dtype, load_tokenizer

log = get_logger(__name__)
_FIX = "run `edge0 verify` on it or re-run `edge0 convert`"
KEEP_MAX_BYTES = 4 << 20  # largest per-call upcast of a kept quantized linear's scales+biases


def _quantize(model: nn.Module, manifest: Manifest, weights: dict[str, Any]) -> None:
    """Make quantized layers where mlx-lm's loader would, and every expert stack."""
    q = manifest.quantization
    experts = {f"{p}.{proj}" for p, _ in switch_modules(model).values() for proj in PROJECTIONS}
    per_layer = manifest.config.get("quantization") or {}
    fixed = {path: projection_quant(q, path.rpartition(".")[2]) for path in experts}
    quantize_stored(model, {**per_layer, **q}, weights, fixed=fixed)


def keeps_dtype(
    modules: Mapping[str, nn.Module], name: str, stored: mx.Dtype, compute: mx.Dtype
) -> bool:
    """Whether the float parameter `name` of a model whose `named_modules()` are `modules`
    stays in its stored (narrower) dtype under `compute`.

    Where the op reads the narrow operand exactly, widening it per group or per call at a
    small cost: the scales and biases of a quantized linear (quantized_matmul upcasts them
    to the activation dtype, bit-identical output; the upcast copy is a transient of the
    fp32 size, so only up to KEEP_MAX_BYTES), those of an expert stack whose experts run
    the native expert FFN (it reads each row's expert in its stored dtype:
    `edge0.kernels.layers.native_experts`), and the weight of an RMSNorm
    (mx.fast.rms_norm, bit-identical). Everything else is cast once at load: expert
    stacks MLX's gather_qmm computes (it would widen all experts per call), embeddings
    (their rows are dequantized in the scales' dtype) and the rest (tiny).
    """
    if compute.size <= stored.size or not mx.issubdtype(stored, mx.floating):
        return False
    path, _, leaf = name.rpartition(".")
    module = modules.get(path)
    if isinstance(module, QuantizedSwitchLinear) and leaf in ("scales", "biases"):
        return native_experts(modules.get(path.rpartition(".")[0]))
    if isinstance(module, nn.QuantizedLinear) and leaf in ("scales", "biases"):
        return 2 * int(module.scales.size) * compute.size <= KEEP_MAX_BYTES
    return isinstance(module, nn.RMSNorm) and leaf == "weight"


def cast_params(model: nn.Module, dtype: mx.Dtype, keep: bool) -> None:
    """Float parameters to `dtype` (lazily), except those `keeps_dtype` keeps when `keep`."""
    modules = dict(model.named_modules())
    updates = []
    flat: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for name, value in flat:
        if not mx.issubdtype(value.dtype, mx.floating) or value.dtype == dtype:
            continue
        if keep and keeps_dtype(modules, name, value.dtype, dtype):
            continue
        updates.append((name, value.astype(dtype)))
    model.load_weights(updates, strict=False)


def resident_bytes(path: Path, manifest: Manifest, dtype: mx.Dtype) -> int:
    """Bytes the resident weights take once loaded with compute dtype `dtype` (experts
    "none"), from the safetensors header and the model's skeleton: nothing is read."""
    return sum(resident_tensor_bytes(path, manifest, dtype).values())


def resident_tensor_bytes(path: Path, manifest: Manifest, dtype: mx.Dtype) -> dict[str, int]:
    """`resident_bytes` per stored tensor name (edge0.ranks sums a rank's own layers)."""
    header = read_header(path / RESIDENT_FILE)
    meta = {k: _Meta(tuple(v.shape), MX_DTYPES[v.dtype]) for k, v in header.items()}
    modules = dict(_skeleton(path, manifest, meta).named_modules())
    out = {}
    for name, m in meta.items():
        target = m.dtype
        if mx.issubdtype(m.dtype, mx.floating) and not keeps_dtype(modules, name, m.dtype, dtype):
            target = dtype
        out[name] = int(np.prod(m.shape, dtype=np.int64)) * target.size
    return out


def expert_dtypes(path: Path, manifest: Manifest, dtype: mx.Dtype) -> dict[str, mx.Dtype]:
    """`stack_dtypes` of the model at `path`, from the headers and its skeleton (the memory
    plan's: nothing is loaded)."""
    header = read_header(path / RESIDENT_FILE)
    meta = {k: _Meta(tuple(v.shape), MX_DTYPES[v.dtype]) for k, v in header.items()}
    return stack_dtypes(_skeleton(path, manifest, meta), manifest, dtype)


def stack_dtypes(model: nn.Module, manifest: Manifest, dtype: mx.Dtype) -> dict[str, mx.Dtype]:
    """Record field -> the dtype an expert stack of `model` holds it in with compute dtype
    `dtype`, resident or in the slot pool (`keeps_dtype`: the stored one where the native
    expert FFN reads it, else `dtype` for a narrower float)."""
    modules = dict(model.named_modules())
    prefix = next(iter(switch_modules(model).values()))[0]  # every layer's stack is alike
    out = {}
    for f in manifest.fields:
        stored = MX_DTYPES[f.dtype]
        float_ = mx.issubdtype(stored, mx.floating) and stored.size < dtype.size
        cast = float_ and not keeps_dtype(modules, f"{prefix}.{f.name}", stored, dtype)
        out[f.name] = dtype if cast else stored
    return out


def _skeleton(path: Path, manifest: Manifest, meta: dict[str, Any]) -> nn.Module:
    """The model quantized as `_open` makes it, from the header's `meta` (lazy: no memory)."""
    model = _build(path, manifest)
    _quantize(model, manifest, meta)
    return model


@attrs.frozen
class _Meta:
    """Shape and dtype of a stored tensor (what mlx-lm's quant inference looks at)."""

    shape: tuple[int, ...]
    dtype: mx.Dtype


def read_expert_stacks(path: Path, manifest: Manifest, layer: int) -> dict[str, mx.array]:
    """All experts of one layer as stacked (E, ...) arrays, CRC-checked, from experts.bin.

    The records are copied into evaluated MLX arrays through their zero-copy numpy views
    (measured), so loading holds the layer once plus one record, not twice.
    """
    stacks = {
        f.name: mx.zeros((manifest.n_experts, *f.shape), dtype=_STACK_DTYPES[f.dtype])
        for f in manifest.fields
    }
    mx.eval(list(stacks.values()))
    views = {name: np.asarray(a) for name, a in stacks.items()}
    record = np.empty(manifest.record_size, dtype=np.uint8)
    with open(path / EXPERTS_FILE, "rb", buffering=0) as fh:
        fh.seek(manifest.record_offset(layer, 0))
        for e in range(manifest.n_experts):
            if fh.readinto(record.data) != manifest.record_size:
                raise CheckpointError(
                    f"{path / EXPERTS_FILE}: layer {layer} expert {e} is cut; {_FIX}"
                )
            if crc32(record.data) != manifest.record_crc(layer, e):
                raise CheckpointError(
                    f"{path / EXPERTS_FILE}: layer {layer} expert {e} fails its CRC32 check; {_FIX}"
                )
            for name, view in field_views(manifest, record).items():
                views[name][e] = view
    return {
        f.name: stacks[f.name].view(mx.bfloat16) if f.dtype == "bfloat16" else stacks[f.name]
        for f in manifest.fields
    }


_STACK_DTYPES = {**MX_DTYPES, "bfloat16": mx.uint16}  # numpy has no bfloat16: filled as bits


def _expert_weights(path: Path, manifest: Manifest, model: nn.Module, experts: str) -> list[Any]:
    out = []
    for layer, (prefix, _) in switch_modules(model).items():
        if experts == "resident":
            for name, arr in read_expert_stacks(path, manifest, layer).items():
                out.append((f"{prefix}.{name}", arr))
        else:  # zero experts, per-expert shapes kept: (0, *field.shape)
            for f in manifest.fields:
                out.append(
                    (f"{prefix}.{f.name}", mx.zeros((0, *f.shape), dtype=MX_DTYPES[f.dtype]))
                )
    return out


def _build(path: Path, manifest: Manifest) -> nn.Module:
    """The float-shaped model of the config, checked against the manifest."""
    try:
        model = build_float_model(manifest.config)
        switch = switch_modules(model)
    except Edge0Error as exc:  # one line, whatever the model code's message holds
        line = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"{path / MANIFEST_FILE}: {line}") from None
    except Exception as exc:  # noqa: BLE001 - mlx-lm rejects a bad config in many ways
        raise CheckpointError(
            f"{path / MANIFEST_FILE}: its config does not build a model "
            f"({type(exc).__name__}: {str(exc)[:120]}); {_FIX}"
        ) from None
    check_model(manifest, switch, path)
    return model


def _open(path: Path, experts: str) -> tuple[Manifest, nn.Module]:
    """Everything opening a layout checks; the model with its weights loaded (unevaluated)."""
    manifest = Manifest.load(path)
    check_files(path, manifest)
    model = _build(path, manifest)
    try:
        weights = mx.load(str(path / RESIDENT_FILE))
    except (RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{path / RESIDENT_FILE} is unreadable ({exc}); {_FIX}") from None
    assert isinstance(weights, dict)
    try:
        _quantize(model, manifest, weights)
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(
            f"{path}: resident weights cannot be quantized as the config says "
            f"({' '.join(str(exc).split())[:160]}); {_FIX}"
        ) from None
    model.eval()
    expert_weights = _expert_weights(path, manifest, model, experts)
    if experts == "none":  # make the placeholders the expected shapes, then load strictly
        model.load_weights(expert_weights, strict=False)
    try:
        model.load_weights(list(weights.items()) + expert_weights, strict=True)
    except ValueError as exc:
        raise CheckpointError(
            f"{path}: resident weights do not match the config "
            f"({' '.join(str(exc).split())[:200]}); {_FIX}"
        ) from None
    check_resident_header(path, manifest)  # last: the specific errors above name the tensor
    return manifest, model


def check_layout(path: str | Path) -> Manifest:
    """Run every check `load_layout` runs, without reading experts or evaluating weights."""
    manifest, _ = _open(Path(path), "none")
    return manifest


def load_layout(
    path: str | Path, experts: str = "resident", dtype: mx.Dtype | None | str = "auto"
) -> Any:
    """Open an edge0-layout directory.

    Args:
        path: the directory written by `edge0 convert` or edge0 synth.
        experts: "resident" reads every expert record (CRC-checked) into the model's
            QuantizedSwitchLinear stacks, so it runs exactly like mlx-lm's int4 model;
            "none" leaves the stacks empty (shape (0, ...)) for the streaming runtime.
        dtype: "auto" computes in `edge0.model.loaded.activation_dtype()` (fp32 on CPU):
            float parameters are cast to it except where the op widens them exactly
            (`keeps_dtype`: small quantized linears' scales/biases, those of expert
            stacks the native expert FFN runs, RMSNorm weights);
            a dtype casts every float parameter to it; None keeps the stored dtypes
            (as mlx-lm).

    Returns:
        edge0.model.loaded.LoadedModel with source_format "edge0".
    """
    if experts not in ("resident", "none"):
        raise ValueError(f"experts must be 'resident' or 'none', not {experts!r}")
    start = time.perf_counter()
    path = Path(path)
    manifest, model = _open(path, experts)
    if isinstance(dtype, str):
        dtype = activation_dtype(MX_DTYPES[manifest.float_dtype])
        cast_params(model, dtype, keep=True)
    elif dtype is not None:
        cast_params(model, dtype, keep=False)
    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for _, value in params:  # one at a time: each source is freed once cast
        mx.eval(value)
    mx.clear_cache()  # the freed load buffers are not kept by MLX's allocator
    config = manifest.config
    eos = config.get("eos_token_id") or config.get("text_config", {}).get("eos_token_id")
    tokenizer = load_tokenizer(path, eos)
    log.info(
        "layout.loaded",
        path=str(path),
        experts=experts,
        seconds=round(time.perf_counter() - start, 3),
    )
    return LoadedModel(
        model=model, tokenizer=tokenizer, config=config, path=path, source_format="edge0"
    )
