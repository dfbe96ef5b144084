"""The CRC32s of a layout's quality artifacts (prerouter heads) in its manifest: taken, recorded
after any write of the heads, and checked by `edge0 verify`."""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from edge0.errors import CheckpointError
from edge0.layout.crc import file_crc32
from edge0.layout.files import FIX
from edge0.layout.manifest import Manifest
from edge0.layout.readable import ARTIFACT_FILES


def artifact_crcs(directory: Path) -> dict[str, int]:
    """The CRC32 of each artifact file in `directory`, by name."""
    return {
        name: file_crc32(directory / name)
        for name in ARTIFACT_FILES
        if (directory / name).is_file()
    }


def record_artifacts(layout: Path) -> Manifest:
    """Record the CRC32s of the artifacts `layout` holds now in its edge0.json (after heads
    were written into it: `edge0 train heads`, `edge0 tune`)."""
    manifest = Manifest.load(layout)
    manifest = attrs.evolve(manifest, artifacts_crc32=artifact_crcs(Path(layout)))
    manifest.save(layout)
    return manifest


def check_artifacts(layout: Path, manifest: Manifest) -> list[str]:
    """Each artifact the manifest lists is present with its CRC32; a CheckpointError names the
    first that is not. Returns the artifacts present but not listed (an older layout)."""
    listed = manifest.artifacts_crc32 or {}
    for name, crc in sorted(listed.items()):
        path = Path(layout) / name
        if not os.path.lexists(path):
            raise CheckpointError(f"{path} is missing but edge0.json lists it; {FIX}")
        if file_crc32(path) != crc:
            raise CheckpointError(
                f"{path} fails its CRC32 check (edge0.json records {crc:#010x}); {FIX}, or "
                "retrain the heads (`edge0 tune`)"
            )
    return [n for n in ARTIFACT_FILES if n not in listed and (Path(layout) / n).is_file()]
