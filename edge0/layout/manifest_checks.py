"""Validation of a parsed edge0.json: every field's type, range and consistency, one clear error
naming the file, the key and the fix (the record layout must be exactly `record_layout`'s).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from edge0.errors import CheckpointError
from edge0.layout.readable import ARTIFACT_FILES
from edge0.layout.records import FIELD_ALIGN, PROJECTIONS, RECORD_ALIGN, RecordField, record_layout

FORMAT_VERSION = 1  # the edge0.json format this Edge0 reads and writes
SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize's affine mode packs
SUPPORTED_GROUPS = (32, 64, 128)
MAX_INT = 1 << 62  # no size, offset or count in a real checkpoint comes near this
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
FIX = "re-run `edge0 convert`"


class _Bad(Exception):
    """A key and what is wrong with it (turned into one CheckpointError)."""


def _int(d: dict[str, Any], key: str, lo: int = 0, hi: int = MAX_INT) -> int:
    value = d.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"{key!r} must be an integer, not {_show(value)}")
    if not lo <= value <= hi:
        raise _Bad(f"{key!r} is {value}, outside [{lo}, {hi}]")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _fields(raw: Any) -> tuple[RecordField, ...]:
    if not isinstance(raw, list) or not raw:
        raise _Bad(f"'fields' must be a non-empty list, not {_show(raw)}")
    out = []
    for i, f in enumerate(raw):
        if not isinstance(f, dict):
            raise _Bad(f"fields[{i}] must be an object, not {_show(f)}")
        name, dtype, shape = f.get("name"), f.get("dtype"), f.get("shape")
        if not isinstance(name, str) or not isinstance(dtype, str):
            raise _Bad(f"fields[{i}] needs string 'name' and 'dtype'")
        if not (name.isprintable() and dtype.isprintable()):  # they are quoted in messages
            raise _Bad(
                f"fields[{i}] 'name' and 'dtype' must be printable, not {_show(name)} "
                f"and {_show(dtype)}"
            )
        if (
            not isinstance(shape, list)
            or not shape
            or not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 < n < MAX_INT for n in shape
            )
        ):
            raise _Bad(f"fields[{i}] ({name}) 'shape' must be a list of positive integers")
        out.append(RecordField(name, dtype, tuple(shape), _int(f, "offset"), _int(f, "nbytes")))
    return tuple(out)


def _layout(q: dict[str, Any], fields: tuple[RecordField, ...], record_size: int) -> None:
    """The stored record layout must be the one `record_layout` computes."""
    by_name = {f.name: f for f in fields}
    gate, down = by_name.get("gate_proj.weight"), by_name.get("down_proj.weight")
    scales, bias = by_name.get("gate_proj.scales"), by_name.get("gate_proj.bias")
    if gate is None or down is None or scales is None:
        raise _Bad(f"'fields' are {[f.name for f in fields]}: gate/down weight and scales needed")
    if len(gate.shape) != 2 or len(down.shape) != 2:
        raise _Bad("weight fields must be 2-D (out, in * bits / 32)")
    d_ff, d_model = gate.shape[0], down.shape[0]
    mode = q.get("mode", "affine")
    try:
        want = record_layout(
            d_model,
            d_ff,
            q["bits"],
            q["group_size"],
            scales.dtype,
            mode,
            bias.dtype if bias is not None else None,
            q.get("projections"),
        )
    except CheckpointError as exc:
        raise _Bad(str(exc)) from None
    names = [f.name for f in fields]
    if names != [f.name for f in want.fields]:
        raise _Bad(f"'fields' are {names}, expected {[f.name for f in want.fields]} in that order")
    for have, need in zip(fields, want.fields, strict=True):
        if have != need:
            raise _Bad(
                f"field {have.name} is {have.dtype}{list(have.shape)} at offset {have.offset} "
                f"({have.nbytes} B); int{q['bits']} group {q['group_size']} of a "
                f"{d_model}x{d_ff} expert needs {need.dtype}{list(need.shape)} at {need.offset} "
                f"({need.nbytes} B)"
            )
    if record_size != want.record_size:
        raise _Bad(f"'record_size' is {record_size}, the fields need {want.record_size}")


def _quantization(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _Bad(f"'quantization' must be an object, not {_show(raw)}")
    bits, group = raw.get("bits"), raw.get("group_size")
    if bits not in SUPPORTED_BITS or isinstance(bits, bool):
        raise _Bad(f"quantization bits {_show(bits)} is not supported (one of {SUPPORTED_BITS})")
    if group not in SUPPORTED_GROUPS or isinstance(group, bool):
        raise _Bad(f"quantization group_size {_show(group)} is not one of {SUPPORTED_GROUPS}")
    if raw.get("mode", "affine") not in ("affine", "mxfp4"):
        raise _Bad(f"quantization mode {_show(raw.get('mode'))} is not supported (affine, mxfp4)")
    _projections(raw.get("projections"))
    return dict(raw)


def _projections(raw: Any) -> None:
    """Per-projection bits / group size (`projections`): known projections, supported values."""
    if raw is None:
        return
    if not isinstance(raw, dict) or not set(raw) <= set(PROJECTIONS):
        raise _Bad(
            f"quantization 'projections' must map {'/'.join(PROJECTIONS)} to objects, "
            f"not {_show(raw)}"
        )
    for proj, own in raw.items():
        if not isinstance(own, dict) or not set(own) <= {"bits", "group_size"}:
            raise _Bad(
                f"quantization projections.{proj} must be {{bits, group_size}}, not {_show(own)}"
            )
        bits, group = own.get("bits", SUPPORTED_BITS[0]), own.get("group_size", SUPPORTED_GROUPS[0])
        if bits not in SUPPORTED_BITS or isinstance(bits, bool):
            raise _Bad(
                f"quantization projections.{proj} bits {_show(bits)} is not supported "
                f"(one of {SUPPORTED_BITS})"
            )
        if group not in SUPPORTED_GROUPS or isinstance(group, bool):
            raise _Bad(
                f"quantization projections.{proj} group_size {_show(group)} is not one of "
                f"{SUPPORTED_GROUPS}"
            )


def _compression(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("codec") != "zstd":
        raise _Bad(f"'compression' must be null or a zstd object, not {_show(raw)}")
    for key in ("file", "index"):
        name = raw.get(key, "")
        if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name):
            raise _Bad(f"compression {key!r} must be a plain file name, not {_show(name)}")
    _int(raw, "level", -(1 << 17), 22)
    if "bytes" in raw:
        _int(raw, "bytes")
    return dict(raw)


def _parse(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise _Bad(f"the top level must be an object, not {_show(d)}")
    version = d.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise CheckpointError(
            f"format version {version!r}, this Edge0 reads {FORMAT_VERSION}; "
            "re-convert the model with this version of `edge0 convert`"
        )
    model_type, config = d.get("model_type"), d.get("config")
    if not isinstance(model_type, str) or not model_type:
        raise _Bad(f"'model_type' must be a non-empty string, not {_show(model_type)}")
    if not isinstance(config, dict) or config.get("model_type") != model_type:
        raise _Bad(f"'config' must be the model's config object with model_type {model_type!r}")
    q = _quantization(d.get("quantization"))
    layers = d.get("moe_layers")
    if (
        not isinstance(layers, list)
        or not layers
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
        or layers != sorted(set(layers))
        or layers[0] < 0
        or layers[-1] > 1 << 20
    ):
        raise _Bad(f"'moe_layers' must be ascending distinct layer indices, not {_show(layers)}")
    n_experts = _int(d, "n_experts", 1, 1 << 20)
    record_size = _int(d, "record_size", RECORD_ALIGN)
    data_offset = _int(d, "data_offset")
    for key, value in (("record_size", record_size), ("data_offset", data_offset)):
        if value % RECORD_ALIGN:
            raise _Bad(f"{key!r} {value} is not a multiple of {RECORD_ALIGN}")
    fields = _fields(d.get("fields"))
    if any(f.offset % FIELD_ALIGN for f in fields):
        raise _Bad(f"field offsets must be multiples of {FIELD_ALIGN}")
    _layout(q, fields, record_size)
    crc = d.get("crc32")
    n_records = len(layers) * n_experts
    if not isinstance(crc, list) or len(crc) != n_records:
        count = len(crc) if isinstance(crc, list) else _show(crc)
        raise _Bad(f"'crc32' must list one CRC per record ({n_records}), not {count}")
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1 << 32 for c in crc):
        raise _Bad("'crc32' entries must be integers in [0, 2**32)")
    resident = d.get("resident_crc32")
    if resident is not None:
        if not isinstance(resident, dict):
            raise _Bad(f"'resident_crc32' must be null or an object, not {_show(resident)}")
        resident = {
            "header": _int(resident, "header", 0, (1 << 32) - 1),
            "file": _int(resident, "file", 0, (1 << 32) - 1),
        }
    return dict(
        format_version=FORMAT_VERSION,
        artifacts_crc32=_artifacts(d.get("artifacts_crc32")),
        model_type=model_type,
        config=config,
        quantization=q,
        moe_layers=tuple(layers),
        n_experts=n_experts,
        record_size=record_size,
        data_offset=data_offset,
        fields=fields,
        crc32=tuple(crc),
        compression=_compression(d.get("compression")),
        resident_crc32=resident,
    )


def _artifacts(value: Any) -> dict[str, int] | None:
    """`artifacts_crc32`: the CRC32 of each quality artifact file (absent in older layouts)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Bad(f"'artifacts_crc32' must be null or an object, not {_show(value)}")
    unknown = sorted(set(value) - set(ARTIFACT_FILES))
    if unknown:
        raise _Bad(f"'artifacts_crc32' names {unknown[0]!r}, not one of {list(ARTIFACT_FILES)}")
    return {name: _int(value, name, 0, (1 << 32) - 1) for name in value}


def parse_manifest(d: Any, path: Path) -> dict[str, Any]:
    """A validated Manifest's fields from the JSON object `d` read from `path`."""
    try:
        return _parse(d)
    except _Bad as exc:
        raise CheckpointError(f"{path}: {exc}; {FIX}") from None
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
