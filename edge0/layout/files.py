"""The cheap checks of a layout's files (presence, sizes, the resident header), and record names.

Opening a layout (edge0.layout.load) runs them; `edge0 verify` (edge0.layout.verify) too,
before it reads every record.
"""

from __future__ import annotations

from pathlib import Path

from edge0.errors import CheckpointError
from edge0.layout.crc import crc32
from edge0.layout.manifest import (
    EXPERTS_FILE,
    RESIDENT_FILE,
    ZSTD_FILE,
    ZSTD_INDEX_FILE,
    Manifest,
)
from edge0.layout.readable import ARTIFACT_FILES, TOKENIZER_FILES, check_present, check_readable
from edge0.layout.safetensors_io import header_bytes, read_header

FIX = "re-run `edge0 convert` (or copy the directory again)"


def record_name(manifest: Manifest, index: int) -> str:
    layer = manifest.moe_layers[index // manifest.n_experts]
    return f"layer {layer} expert {index % manifest.n_experts}"


def check_files(path: Path, manifest: Manifest) -> None:
    """Presence and sizes of resident.safetensors and experts.bin; every file that opening
    reads is a readable regular file (cheap)."""
    resident = path / RESIDENT_FILE
    check_readable(resident, FIX, CheckpointError)
    read_header(resident)  # every tensor's bytes lie within the file
    experts = path / EXPERTS_FILE
    check_readable(experts, FIX, CheckpointError)
    check_present(
        path, (*TOKENIZER_FILES, *ARTIFACT_FILES, ZSTD_FILE, ZSTD_INDEX_FILE), FIX, CheckpointError
    )
    size, want = experts.stat().st_size, manifest.experts_file_size
    if size != want:
        detail = ""
        if size < want:
            cut = max(0, (size - manifest.data_offset) // manifest.record_size)
            detail = f"; records from {record_name(manifest, cut)} on are cut off"
        raise CheckpointError(
            f"{experts} has {size} bytes, the manifest says {want}{detail}; {FIX}"
        )
    if len(manifest.crc32) != manifest.n_records:
        raise CheckpointError(
            f"{path / 'edge0.json'} lists {len(manifest.crc32)} CRCs for "
            f"{manifest.n_records} records; {FIX}"
        )


def check_resident_header(path: Path, manifest: Manifest) -> None:
    """The resident header is the one convert wrote (a swapped dtype or offset cannot pass)."""
    crcs, resident = manifest.resident_crc32, path / RESIDENT_FILE
    if crcs is not None and crc32(header_bytes(resident)) != crcs["header"]:
        raise CheckpointError(f"{resident}: the safetensors header fails its CRC32 check; {FIX}")
