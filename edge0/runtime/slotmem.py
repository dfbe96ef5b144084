"""Slot memory: per streamed layer one MLX byte buffer of record-shaped slots, and its field views.

A slot is one expert record, byte for byte as it sits in `experts.bin`, so a tier
reads a record straight into slot memory (`dest(layer, slot)`, a writable view
of an evaluated MLX array, FACTS.md) and no copy follows. The MLX operands of
`gather_qmm` are strided views over the same bytes: field `gate_proj.weight` of
all slots is an (n_slots, out, in*bits/32) uint32 array whose slot stride is the
record size. Measured: gather_qmm reads these views in place (no copy, same
speed as a contiguous stack). The buffer start is 4 KiB-aligned so O_DIRECT
tiers can read into it.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from edge0.layout.manifest import Manifest

ALIGN = 4096
MX_DTYPES = {
    "uint32": mx.uint32,
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
    """Slot buffers of all streamed layers. Build on the compute thread."""

    def __init__(self, manifest: Manifest, layers: list[int], n_slots: int) -> None:
        self.manifest = manifest
        self.n_slots = n_slots
        self.record_size = r = manifest.record_size
        self._buffers: dict[int, mx.array] = {}
        self._rows: dict[int, np.ndarray] = {}  # layer -> (n_slots, record_size) uint8
        self.views: dict[int, dict[str, mx.array]] = {}  # layer -> field -> (n_slots, *shape)
        for layer in layers:
            buf = mx.zeros((n_slots * r + ALIGN,), dtype=mx.uint8)
            mx.eval(buf)
            flat = np.asarray(buf)  # zero-copy and writable on the CPU (FACTS.md)
            base = (-flat.ctypes.data) % ALIGN
            self._buffers[layer] = buf
            self._rows[layer] = flat[base : base + n_slots * r].reshape(n_slots, r)
            self.views[layer] = self._field_views(buf, base)
        mx.eval([list(v.values()) for v in self.views.values()])

    def _field_views(self, buf: mx.array, base: int) -> dict[str, mx.array]:
        views = {}
        for f in self.manifest.fields:
            dtype = MX_DTYPES[f.dtype]
            size = dtype.size
            if (base + f.offset) % size or self.record_size % size:
                raise ValueError(f"field {f.name} is not aligned to its dtype in the record")
            typed = buf.view(dtype)  # (n_slots * record_size / size,)
            views[f.name] = mx.as_strided(
                typed,
                shape=(self.n_slots, *f.shape),
                strides=[self.record_size // size, *_row_major(f.shape)],
                offset=(base + f.offset) // size,
            )
        return views

    def dest(self, layer: int, slot: int) -> memoryview:
        """The writable record-sized memory of one slot (the tier reads into it)."""
        return memoryview(self._rows[layer][slot])

    def field(self, layer: int, name: str) -> mx.array:
        return self.views[layer][name]

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self._buffers.values())
