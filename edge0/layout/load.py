"""Open an edge0-layout directory as an mlx-lm model: `load_layout(path, experts=...)`."""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.errors import CheckpointError
from edge0.layout.manifest import EXPERTS_FILE, RESIDENT_FILE, Manifest
from edge0.layout.model import build_float_model
from edge0.layout.quant import quantize_stored, switch_modules
from edge0.layout.records import PROJECTIONS, field_views
from edge0.layout.safetensors_io import MX_DTYPES
from edge0.layout.verify import check_files
from edge0.log import get_logger
from edge0.model.loaded import LoadedModel, activation_dtype, load_tokenizer

log = get_logger(__name__)
_FIX = "run `edge0 verify` on it or re-run `edge0 convert`"


def _quantize(model: nn.Module, manifest: Manifest, weights: dict[str, mx.array]) -> None:
    """Make quantized layers where mlx-lm's loader would, and every expert stack."""
    q = manifest.quantization
    experts = {f"{p}.{proj}" for p, _ in switch_modules(model).values() for proj in PROJECTIONS}
    settings = {"group_size": q["group_size"], "bits": q["bits"], "mode": q["mode"]}
    per_layer = manifest.config.get("quantization") or {}
    quantize_stored(model, {**per_layer, **q}, weights, fixed=dict.fromkeys(experts, settings))


def read_expert_stacks(path: Path, manifest: Manifest, layer: int) -> dict[str, mx.array]:
    """All experts of one layer as stacked (E, ...) arrays, CRC-checked, from experts.bin."""
    stacks = {
        f.name: np.empty((manifest.n_experts, *f.shape), dtype=v.dtype)
        for f, v in zip(
            manifest.fields,
            field_views(manifest, np.zeros(manifest.record_size, np.uint8)).values(),
            strict=True,
        )
    }
    record = np.empty(manifest.record_size, dtype=np.uint8)
    with open(path / EXPERTS_FILE, "rb", buffering=0) as fh:
        fh.seek(manifest.record_offset(layer, 0))
        for e in range(manifest.n_experts):
            if fh.readinto(record.data) != manifest.record_size:
                raise CheckpointError(
                    f"{path / EXPERTS_FILE}: layer {layer} expert {e} is cut; {_FIX}"
                )
            if zlib.crc32(record.data) != manifest.record_crc(layer, e):
                raise CheckpointError(
                    f"{path / EXPERTS_FILE}: layer {layer} expert {e} fails its CRC32 check; {_FIX}"
                )
            for name, view in field_views(manifest, record).items():
                stacks[name][e] = view
    out = {}
    for field in manifest.fields:
        arr = mx.array(stacks[field.name])
        out[field.name] = arr.view(mx.bfloat16) if field.dtype == "bfloat16" else arr
    return out


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


def load_layout(
    path: str | Path, experts: str = "resident", dtype: mx.Dtype | None | str = "auto"
) -> Any:
    """Open an edge0-layout directory.

    Args:
        path: the directory written by `edge0 convert` or tools/synth_checkpoint.py.
        experts: "resident" reads every expert record (CRC-checked) into the model's
            QuantizedSwitchLinear stacks, so it runs exactly like mlx-lm's int4 model;
            "none" leaves the stacks empty (shape (0, ...)) for the streaming runtime.
        dtype: "auto" casts float parameters to `edge0.model.loaded.activation_dtype()` as
            `edge0.load` does (fp32 on CPU); None keeps the stored dtypes (as mlx-lm).

    Returns:
        edge0.model.loaded.LoadedModel with source_format "edge0".
    """
    if experts not in ("resident", "none"):
        raise ValueError(f"experts must be 'resident' or 'none', not {experts!r}")
    start = time.perf_counter()
    path = Path(path)
    manifest = Manifest.load(path)
    check_files(path, manifest)
    model = build_float_model(manifest.config)
    try:
        weights = mx.load(str(path / RESIDENT_FILE))
    except (RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{path / RESIDENT_FILE} is unreadable ({exc}); {_FIX}") from None
    assert isinstance(weights, dict)
    _quantize(model, manifest, weights)
    model.eval()
    expert_weights = _expert_weights(path, manifest, model, experts)
    if experts == "none":  # make the placeholders the expected shapes, then load strictly
        model.load_weights(expert_weights, strict=False)
    try:
        model.load_weights(list(weights.items()) + expert_weights, strict=True)
    except ValueError as exc:
        raise CheckpointError(
            f"{path}: resident weights do not match the config "
            f"({' '.join(str(exc).split())}); {_FIX}"
        ) from None
    if isinstance(dtype, str):
        dtype = activation_dtype(MX_DTYPES[manifest.field("gate_proj.scales").dtype])
    if dtype is not None:
        model.set_dtype(dtype)
    mx.eval(model.parameters())
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
