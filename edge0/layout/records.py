"""One expert record: the field layout, packing fields into a record buffer, numpy views of one
(docs/format.md, "Inside a record").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import numpy as np

from edge0.errors import CheckpointError

RECORD_ALIGN = 16 * 1024  # record size and data offset: one aligned read fetches one expert
FIELD_ALIGN = 64  # each field's offset inside a record
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
PARTS = ("weight", "scales", "biases")
FIELD_NAMES = tuple(f"{p}.{q}" for p in PROJECTIONS for q in PARTS)
FLOATS = ("bfloat16", "float16", "float32")
# quantization mode -> (the only bits/group it packs or None for any, its scales dtype or None)
MODES: dict[str, tuple[tuple[int, int] | None, str | None]] = {
    "affine": (None, None),
    "mxfp4": ((4, 32), "uint8"),
}

# numpy dtype used to view each logical dtype (numpy has no bfloat16: its bits as uint16)
VIEW_DTYPES = {
    "uint32": "uint32",
    "uint8": "uint8",
    "bfloat16": "uint16",
    "float16": "float16",
    "float32": "float32",
}


@attrs.frozen
class RecordField:
    """One tensor inside an expert record (e.g. `gate_proj.weight`)."""

    name: str  # "gate_proj.weight", "gate_proj.scales", "gate_proj.biases", ...
    dtype: str  # numpy dtype name: "uint32", "float16", "bfloat16", "float32"
    shape: tuple[int, ...]  # per expert, e.g. (d_ff, d_model * bits // 32)
    offset: int  # bytes from the record start
    nbytes: int


class RecordLayout(Protocol):
    """A record's fields and size: a `RecordSpec`, or the `Manifest` that carries one."""

    @property
    def fields(self) -> tuple[RecordField, ...]: ...

    @property
    def record_size(self) -> int: ...


@attrs.frozen
class RecordSpec:
    """The record layout alone (what `Manifest` carries as `fields` and `record_size`)."""

    fields: tuple[RecordField, ...]
    record_size: int


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def projection_quant(q: Mapping[str, Any], proj: str) -> dict[str, Any]:
    """One projection's {group_size, bits, mode}: the record's, or its own `projections` entry.

    A quantization dict may give projections their own bits / group size (a family's
    mlx-lm predicate: `down_proj` at 8 bits): `{"projections": {"down_proj": {...}}}`.
    """
    own = (q.get("projections") or {}).get(proj) or {}
    return {
        "group_size": int(own.get("group_size", q["group_size"])),
        "bits": int(own.get("bits", q["bits"])),
        "mode": q.get("mode", "affine"),
    }


def record_layout(
    d_model: int,
    d_ff: int,
    bits: int,
    group_size: int,
    scale_dtype: str,
    mode: str = "affine",
    bias_dtype: str | None = None,
    projections: Mapping[str, Mapping[str, int]] | None = None,
) -> RecordSpec:
    """Fields and padded size (a multiple of RECORD_ALIGN) of one expert's record.

    d_model is the model width, d_ff the expert's hidden width; `bias_dtype` adds each
    projection's own bias (experts with biased linears), None leaves it out;
    `projections` gives a projection its own bits / group size (affine only).
    """
    if mode not in MODES:
        raise CheckpointError(f"quantization mode {mode!r} is not one of {', '.join(MODES)}")
    only, mode_scales = MODES[mode]
    if only is not None and (bits, group_size) != only:
        raise CheckpointError(f"mode {mode} packs {only[0]} bits in groups of {only[1]} only")
    if projections and mode != "affine":
        raise CheckpointError(f"mode {mode} has one bits / group size for all projections")
    allowed = (mode_scales,) if mode_scales else FLOATS
    if scale_dtype not in allowed:
        raise CheckpointError(f"scales dtype {scale_dtype!r} is not one of {', '.join(allowed)}")
    if bias_dtype is not None and bias_dtype not in FLOATS:
        raise CheckpointError(f"unsupported expert bias dtype {bias_dtype!r}")
    q = {"bits": bits, "group_size": group_size, "mode": mode, "projections": projections}
    # (out_dims, in_dims) of each projection's weight
    dims = {"gate_proj": (d_ff, d_model), "up_proj": (d_ff, d_model), "down_proj": (d_model, d_ff)}
    for proj, (_, in_d) in dims.items():
        pq = projection_quant(q, proj)
        if in_d % pq["group_size"] or (in_d * pq["bits"]) % 32:
            raise CheckpointError(
                f"expert dimension {in_d} ({proj} input) is not a multiple of group size "
                f"{pq['group_size']}; pick a --group-size that divides both the model width "
                "and expert width"
            )
    scale_size = np.dtype(VIEW_DTYPES[scale_dtype]).itemsize
    fields = []
    offset = 0
    for proj in PROJECTIONS:
        out_d, in_d = dims[proj]
        pq = projection_quant(q, proj)
        groups = in_d // pq["group_size"]
        specs: list[tuple[str, str, tuple[int, ...], int]] = [
            ("weight", "uint32", (out_d, in_d * pq["bits"] // 32), 4),
            ("scales", scale_dtype, (out_d, groups), scale_size),
        ]
        if mode == "affine":
            specs.append(("biases", scale_dtype, (out_d, groups), scale_size))
        if bias_dtype is not None:
            specs.append(("bias", bias_dtype, (out_d,), np.dtype(VIEW_DTYPES[bias_dtype]).itemsize))
        for part, dtype, shape, itemsize in specs:
            nbytes = int(np.prod(shape)) * itemsize
            fields.append(RecordField(f"{proj}.{part}", dtype, shape, offset, nbytes))
            offset = _align(offset + nbytes, FIELD_ALIGN)
    return RecordSpec(tuple(fields), _align(offset, RECORD_ALIGN))


def field_views(manifest: RecordLayout, buffer: Any) -> dict[str, np.ndarray]:
    """Numpy views, one per field, into a record-sized buffer (no copy).

    `buffer` is anything exposing the buffer protocol with at least `record_size` bytes
    (bytearray, memoryview, a numpy uint8 array, `np.asarray` of an evaluated MLX array).
    The views are writable when the buffer is. bfloat16 fields are viewed as uint16.
    """
    mem = np.frombuffer(buffer, dtype=np.uint8) if not isinstance(buffer, np.ndarray) else buffer
    mem = mem.reshape(-1).view(np.uint8)
    if mem.nbytes < manifest.record_size:
        raise CheckpointError(
            f"record buffer has {mem.nbytes} bytes, a record needs {manifest.record_size}"
        )
    views = {}
    for f in manifest.fields:
        chunk = mem[f.offset : f.offset + f.nbytes]
        views[f.name] = chunk.view(VIEW_DTYPES[f.dtype]).reshape(f.shape)
    return views


def pack_record(
    manifest: RecordLayout, arrays: Mapping[str, np.ndarray], out: Any = None
) -> np.ndarray:
    """Pack one expert's fields into a record (a new zeroed uint8 array, or `out`).

    `arrays` maps every field name to a numpy array of the field's shape whose itemsize
    matches (bfloat16 given as uint16). Padding bytes are zero.
    """
    buf = np.zeros(manifest.record_size, dtype=np.uint8) if out is None else out
    if out is not None:
        np.frombuffer(buf, dtype=np.uint8)[:] = 0
    views = field_views(manifest, buf)
    for f in manifest.fields:
        src = arrays[f.name]
        if tuple(src.shape) != f.shape or src.dtype.itemsize != views[f.name].dtype.itemsize:
            raise CheckpointError(
                f"field {f.name}: got {src.dtype}{tuple(src.shape)}, "
                f"record wants {f.dtype}{f.shape}"
            )
        views[f.name][...] = src.view(views[f.name].dtype)
    return np.asarray(buf) if out is None else np.frombuffer(buf, dtype=np.uint8)


def unpack_record(manifest: RecordLayout, buffer: Any) -> dict[str, np.ndarray]:
    """Copies of every field of a record (bfloat16 as uint16)."""
    return {k: v.copy() for k, v in field_views(manifest, buffer).items()}
