"""`edge0.json`: the manifest of an edge0-layout checkpoint, the record offset rule, and the
check of a built model against it (docs/format.md, "edge0.json" and "The offset rule").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

from edge0.errors import CheckpointError
from edge0.layout.manifest_checks import FIX, parse_manifest
from edge0.layout.records import RecordField

MANIFEST_FILE = "edge0.json"
RESIDENT_FILE = "resident.safetensors"
EXPERTS_FILE = "experts.bin"
ZSTD_FILE = "experts.zst"
ZSTD_INDEX_FILE = "experts.zst.idx"


@attrs.frozen
class Manifest:
    """Everything needed to locate, size and check any expert record."""

    format_version: int
    model_type: str
    config: dict[str, Any]  # the model's config.json, as loaded
    quantization: dict[str, Any]  # {"bits": 4, "group_size": 64, "mode": "affine"}
    moe_layers: tuple[int, ...]  # model layer indices that have routed experts
    n_experts: int
    record_size: int
    data_offset: int
    fields: tuple[RecordField, ...]
    crc32: tuple[int, ...]  # one per record, in record order
    compression: dict[str, Any] | None = None  # {"codec": "zstd", "level": 3} or None
    # CRC32s of resident.safetensors: {"header": of its 8 + N header bytes, "file": of all}
    resident_crc32: dict[str, int] | None = None
    # CRC32 of each quality artifact file (prerouter heads) the layout holds, by file name;
    # None in layouts written before it was recorded (their artifacts are not CRC-checked)
    artifacts_crc32: dict[str, int] | None = None

    # --- the offset rule -------------------------------------------------
    def record_index(self, layer: int, expert: int) -> int:
        """Index of the record of model layer `layer`, expert `expert`."""
        try:
            ordinal = self.moe_layers.index(layer)
        except ValueError:
            raise CheckpointError(
                f"layer {layer} has no routed experts in this checkpoint "
                f"(MoE layers: {list(self.moe_layers)})"
            ) from None
        if not 0 <= expert < self.n_experts:
            raise CheckpointError(
                f"expert {expert} out of range for layer {layer} (0..{self.n_experts - 1})"
            )
        return ordinal * self.n_experts + expert

    def record_offset(self, layer: int, expert: int) -> int:
        return self.data_offset + self.record_index(layer, expert) * self.record_size

    def record_crc(self, layer: int, expert: int) -> int:
        return self.crc32[self.record_index(layer, expert)]

    @property
    def n_records(self) -> int:
        return len(self.moe_layers) * self.n_experts

    @property
    def experts_file_size(self) -> int:
        return self.data_offset + self.n_records * self.record_size

    @property
    def float_dtype(self) -> str:
        """The records' float dtype (scales; the expert biases in mxfp4 records, which have
        uint8 scales), what the compute dtype follows on Metal/CUDA."""
        floats = [f.dtype for f in self.fields if f.dtype in ("bfloat16", "float16", "float32")]
        return floats[0] if floats else "bfloat16"

    def field(self, name: str) -> RecordField:
        for f in self.fields:
            if f.name == name:
                return f
        raise CheckpointError(f"record has no field {name!r}")

    # --- (de)serialisation ------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d = attrs.asdict(self, recurse=True)
        d["moe_layers"] = list(self.moe_layers)
        d["crc32"] = list(self.crc32)
        d["fields"] = [dict(attrs.asdict(f), shape=list(f.shape)) for f in self.fields]
        return d

    def save(self, directory: Path) -> None:
        """Write edge0.json (atomically: a reader sees the old file or the new one)."""
        path = Path(directory) / MANIFEST_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = Path(directory) / MANIFEST_FILE
        if not path.is_file():
            raise CheckpointError(
                f"{path} not found: not an edge0-layout directory; create one with `edge0 convert`"
            )
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as exc:
            raise CheckpointError(f"{path} is unreadable ({exc}); re-run `edge0 convert`") from None
        return cls(**parse_manifest(d, path))


def check_model(manifest: Manifest, switch: dict[int, Any], path: Path) -> None:
    """The model built from the config has the manifest's MoE layers, experts and widths.

    `switch` is `edge0.layout.quant.switch_modules(model)` of the float-shaped model.
    """
    layers = tuple(switch)
    if layers != manifest.moe_layers:
        raise CheckpointError(
            f"{path}: edge0.json lists MoE layers {list(manifest.moe_layers)}, its config builds "
            f"{list(layers)}; {FIX}"
        )
    n, d_ff, d_model = switch[layers[0]][1].gate_proj.weight.shape  # (E, ff, d)
    want_ff = manifest.field("gate_proj.weight").shape[0]
    want_d = manifest.field("down_proj.weight").shape[0]
    if (n, d_ff, d_model) != (manifest.n_experts, want_ff, want_d):
        raise CheckpointError(
            f"{path}: the config builds {n} experts of {d_model}x{d_ff}, edge0.json records "
            f"{manifest.n_experts} of {want_d}x{want_ff}; {FIX}"
        )
