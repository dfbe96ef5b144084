"""Slot memory: one MLX byte buffer of record-shaped slots for all streamed layers, its field
views and, where MLX's gather_qmm computes the experts, a compute-dtype sidecar of their
scales and biases (docs/runtime.md, "Slot memory and the slot pool").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import numpy as np

from edge0.layout.manifest import Manifest
from edge0.layout.records import VIEW_DTYPES

ALIGN = 4096
DIM_LIMIT = 1 << 31  # MLX shapes are int32 (68 slots of 8x7B experts: 6.7 GB)
POOL_LIMIT = 4 * (DIM_LIMIT - 1)  # bytes: a field's uint32 word view of the pool has int32 dims
MX_DTYPES = {
    "uint32": mx.uint32,
    "uint8": mx.uint8,  # mxfp4 scales
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
    "float32": mx.float32,
}


def _row_major(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return list(reversed(strides))


class SlotMemory:
    """The slot pool's buffer and views (`views[layer]` is the same pool for every layer).

    `dtypes`: record field -> the dtype its view holds (`edge0.layout.load.stack_dtypes`, the
    rule resident expert stacks follow). A bf16/fp16 field held as float32 (MLX's gather_qmm
    computes the experts) gets a float32 sidecar copy, widened after each read (`widen`);
    one held as stored (the native expert FFN reads it so), or any field under a None map,
    is viewed in the record's own bytes. Build on the compute thread.
    """

    def __init__(
        self,
        manifest: Manifest,
        layers: list[int],
        n_slots: int,
        dtypes: Mapping[str, mx.Dtype] | None = None,
    ) -> None:
        self.manifest = manifest
        self.n_slots = n_slots
        self.record_size = r = manifest.record_size
        total = n_slots * r + ALIGN  # an MLX dimension is int32: a larger pool is 2-D
        shape = (total,) if total < DIM_LIMIT else (-(-total // ALIGN), ALIGN)
        self._buffer = mx.zeros(shape, dtype=mx.uint8)
        mx.eval(self._buffer)
        flat = np.asarray(self._buffer).reshape(-1)  # zero-copy, writable on the CPU (measured)
        base = (-flat.ctypes.data) % ALIGN
        rows = flat[base : base + n_slots * r].reshape(n_slots, r)  # (n_slots, record_size) uint8
        self.pool = self._field_views(self._buffer, base)  # field -> (n_slots, *shape)
        self.widened = _widened(manifest, dtypes)
        self._side: mx.array | None = None
        self._side_rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if self.widened:
            self._add_sidecar(rows)
        mx.eval(list(self.pool.values()))
        self._rows = {layer: rows for layer in layers}
        self.views: dict[int, dict[str, mx.array]] = {layer: self.pool for layer in layers}

    def _add_sidecar(self, rows: np.ndarray) -> None:
        fields = [f for f in self.manifest.fields if f.name in self.widened]
        width = sum(int(np.prod(f.shape)) for f in fields)
        self._side = mx.zeros((self.n_slots, width), dtype=mx.float32)
        mx.eval(self._side)
        side = np.asarray(self._side)  # (n_slots, width) float32, zero-copy
        at = 0
        for f in fields:
            n = int(np.prod(f.shape))
            src = rows[:, f.offset : f.offset + f.nbytes].view(VIEW_DTYPES[f.dtype])
            dst = side[:, at : at + n]
            self._side_rows[f.name] = (src, dst.view(np.uint32) if f.dtype == "bfloat16" else dst)
            self.pool[f.name] = mx.as_strided(
                self._side,
                shape=(self.n_slots, *f.shape),
                strides=[width, *_row_major(f.shape)],
                offset=at,
            )
            at += n

    def widen(self, slot: int) -> None:
        """Copy the slot's scales and biases into the compute-dtype sidecar (after a read)."""
        for src, dst in self._side_rows.values():
            if dst.dtype == np.uint32:  # bfloat16 bits -> float32 bits: exact
                np.left_shift(src[slot], 16, out=dst[slot], dtype=np.uint32)
            else:
                dst[slot] = src[slot]

    def _field_views(self, buf: mx.array, base: int) -> dict[str, mx.array]:
        views = {}
        for f in self.manifest.fields:
            dtype = MX_DTYPES[f.dtype]
            size = dtype.size
            if (base + f.offset) % size or self.record_size % size:
                raise ValueError(f"field {f.name} is not aligned to its dtype in the record")
            if buf.ndim == 2 and size < 4:  # a pool past int32 elements: as 4-byte words
                views[f.name] = self._word_view(buf, base, f.name, f.offset, f.shape, dtype)
                continue
            typed = buf.view(dtype)  # (n_slots * record_size / size,)
            views[f.name] = mx.as_strided(
                typed,
                shape=(self.n_slots, *f.shape),
                strides=[self.record_size // size, *_row_major(f.shape)],
                offset=(base + f.offset) // size,
            )
        return views

    def _word_view(
        self, buf: mx.array, base: int, name: str, offset: int, shape: tuple[int, ...], dtype: Any
    ) -> mx.array:
        """A narrow field's view built over uint32 words and viewed back: MLX flattens the
        operand of as_strided, and a 2-byte view of a pool over 4 GiB has too many elements."""
        per = 4 // dtype.size
        if (base + offset) % 4 or self.record_size % 4 or shape[-1] % per:
            raise ValueError(f"field {name} of a pool over 2 GiB is not word-aligned")
        words = (*shape[:-1], shape[-1] // per)
        return mx.as_strided(
            buf.view(mx.uint32),
            shape=(self.n_slots, *words),
            strides=[self.record_size // 4, *_row_major(words)],
            offset=(base + offset) // 4,
        ).view(dtype)

    def dest(self, layer: int, slot: int) -> memoryview:
        """The writable record-sized memory of one pool slot (the tier reads into it)."""
        return memoryview(self._rows[layer][slot])

    def field(self, layer: int, name: str) -> mx.array:
        return self.views[layer][name]

    @property
    def nbytes(self) -> int:
        side = int(self._side.nbytes) if self._side is not None else 0
        return int(self._buffer.nbytes) + side


def _widened(manifest: Manifest, dtypes: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Record fields (bf16/fp16 scales, biases) that `dtypes` holds as float32."""
    if dtypes is None:
        return ()
    narrow = ("bfloat16", "float16")
    return tuple(
        f.name for f in manifest.fields if f.dtype in narrow and dtypes[f.name] == mx.float32
    )


def slot_bytes(manifest: Manifest, n_slots: int, dtypes: Mapping[str, Any] | None = None) -> int:
    """Bytes of a slot pool of `n_slots` records and its sidecar, the fields held in `dtypes`
    (the memory plan's figure)."""
    wide = set(_widened(manifest, dtypes))
    side = sum(4 * int(np.prod(f.shape)) for f in manifest.fields if f.name in wide)
    return n_slots * (manifest.record_size + side) + ALIGN
