"""Byte-level safetensors access: read one tensor or one row range, write a file tensor by tensor.

safetensors' own `safe_open` cannot slice bfloat16 tensors without torch (numpy has no
bfloat16), so Edge0 reads the header itself and `pread`s exactly the bytes it needs.
Raw tensors travel as numpy arrays whose dtype has the right width (bfloat16 as uint16);
the logical dtype name travels next to them.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import mlx.core as mx
import numpy as np

from edge0.errors import CheckpointError

# safetensors dtype code -> (logical dtype name, numpy storage dtype)
ST_DTYPES: dict[str, tuple[str, str]] = {
    "BF16": ("bfloat16", "uint16"),
    "F16": ("float16", "float16"),
    "F32": ("float32", "float32"),
    "F64": ("float64", "float64"),
    "U32": ("uint32", "uint32"),
    "I32": ("int32", "int32"),
    "I64": ("int64", "int64"),
    "U8": ("uint8", "uint8"),
    "I8": ("int8", "int8"),
    "U16": ("uint16", "uint16"),
    "BOOL": ("bool", "bool"),
}
ST_CODE = {logical: code for code, (logical, _) in ST_DTYPES.items()}
STORAGE = {logical: storage for logical, storage in ST_DTYPES.values()}
MX_DTYPES = {
    "bfloat16": mx.bfloat16,
    "float16": mx.float16,
    "float32": mx.float32,
    "uint32": mx.uint32,
    "int32": mx.int32,
    "int64": mx.int64,
    "uint8": mx.uint8,
    "int8": mx.int8,
    "uint16": mx.uint16,
    "bool": mx.bool_,
}


@attrs.frozen
class TensorInfo:
    """Where one tensor lives inside a safetensors file."""

    name: str
    file: Path
    dtype: str  # logical name ("bfloat16", "uint32", ...)
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int

    @property
    def itemsize(self) -> int:
        return np.dtype(STORAGE[self.dtype]).itemsize


MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit


def header_bytes(path: Path) -> bytes:
    """The 8-byte length prefix and the JSON header of a safetensors file, bounds-checked."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: {size} bytes is too short for a safetensors file")
            (n,) = struct.unpack("<Q", prefix)
            if n > min(MAX_HEADER, size - 8):
                raise CheckpointError(
                    f"{path}: safetensors header length {n} exceeds the file ({size} bytes) or "
                    f"the format's {MAX_HEADER}-byte limit; the file is damaged"
                )
            return prefix + f.read(n)
    except OSError as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check the header of one safetensors file (every entry within the file)."""
    blob = header_bytes(path)
    size = os.path.getsize(path)
    try:
        header = json.loads(blob[8:])
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: the safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    base = len(blob)
    out: dict[str, TensorInfo] = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        out[name] = _tensor_info(path, name, d, base, size)
    return out


def _tensor_info(path: Path, name: str, d: Any, base: int, size: int) -> TensorInfo:
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: tensor {name} {what}; the file is damaged, re-create it")

    if not isinstance(d, dict):
        raise bad("has no header entry object")
    dtype, shape, offsets = d.get("dtype"), d.get("shape"), d.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ST_DTYPES:
        raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 40 for n in shape
    ):
        raise bad(f"has a malformed shape {str(shape)[:40]}")
    if not isinstance(offsets, list) or len(offsets) != 2 or {type(o) for o in offsets} != {int}:
        raise bad(f"has malformed data_offsets {str(offsets)[:40]}")
    begin, end = offsets
    itemsize = np.dtype(ST_DTYPES[dtype][1]).itemsize
    nbytes = int(np.prod(shape, dtype=object)) * itemsize
    if not 0 <= begin <= end or end - begin != nbytes:
        raise bad(f"has data_offsets {offsets} for {nbytes} bytes of {dtype}{shape}")
    if base + end > size:
        raise CheckpointError(
            f"{path} is truncated: tensor {name} ends at byte {base + end}, the file has "
            f"{size}; re-create it"
        )
    return TensorInfo(name, Path(path), ST_DTYPES[dtype][0], tuple(shape), base + begin, nbytes)


def read_raw(info: TensorInfo, rows: tuple[int, int] | None = None) -> np.ndarray:
    """Read a tensor (or rows [a, b) of its first axis) as a numpy array of storage dtype."""
    shape = info.shape
    start, nbytes = info.start, info.nbytes
    if rows is not None:
        a, b = rows
        row_bytes = info.nbytes // shape[0]
        start, nbytes = start + a * row_bytes, (b - a) * row_bytes
        shape = (b - a, *shape[1:])
    buf = np.empty(nbytes, dtype=np.uint8)
    with open(info.file, "rb", buffering=0) as f:
        got = f.readinto(buf.data) if f.seek(start) == start else 0
    if got != nbytes:
        raise CheckpointError(
            f"{info.file}: tensor {info.name} is truncated (wanted {nbytes} bytes at {start}, "
            f"got {got}); the source checkpoint is incomplete"
        )
    return buf.view(STORAGE[info.dtype]).reshape(shape)


def to_mx(raw: np.ndarray, dtype: str) -> mx.array:
    """A numpy array of storage dtype -> an MLX array of the logical dtype (copies)."""
    arr = mx.array(raw)
    return arr.view(mx.bfloat16) if dtype == "bfloat16" else arr


def mx_dtype_name(a: mx.array) -> str:
    for name, dt in MX_DTYPES.items():
        if a.dtype == dt:
            return name
    raise CheckpointError(f"unsupported array dtype {a.dtype}")


def to_raw(a: mx.array) -> np.ndarray:
    """An evaluated MLX array -> numpy array of storage dtype (bfloat16 as uint16)."""
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.asarray(a)


class SafetensorsWriter:
    """Writes a safetensors file whose header is known up front, tensor by tensor.

    Usage: `w = SafetensorsWriter(path, [(name, dtype, shape), ...])`, then `w.write(name, raw)`
    for every tensor in the same order, then `w.close()`.
    """

    def __init__(
        self,
        path: Path,
        plan: Iterable[tuple[str, str, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ) -> None:
        header: dict[str, Any] = {"__metadata__": metadata or {"format": "mlx"}}
        self._order: list[tuple[str, int]] = []
        offset = 0
        for name, dtype, shape in plan:
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(STORAGE[dtype]).itemsize
            header[name] = {
                "dtype": ST_CODE[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            self._order.append((name, nbytes))
            offset += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115
        self._file.write(struct.pack("<Q", len(blob)) + blob)
        self._next = 0

    def write(self, name: str, raw: np.ndarray) -> None:
        want, nbytes = self._order[self._next]
        if name != want or raw.nbytes != nbytes:
            raise ValueError(
                f"safetensors writer: got {name} ({raw.nbytes} B), expected {want} ({nbytes} B)"
            )
        self._file.write(np.ascontiguousarray(raw).data)
        self._next += 1

    def close(self) -> None:
        if self._next != len(self._order):
            self._file.close()
            raise ValueError(
                f"safetensors writer closed after {self._next} of {len(self._order)} tensors"
            )
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
