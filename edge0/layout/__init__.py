"""The edge0 checkpoint layout: manifest, expert records, conversion and verification."""

from edge0.layout.manifest import (
    EXPERTS_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    RECORD_ALIGN,
    RESIDENT_FILE,
    Manifest,
    RecordField,
)

__all__ = [
    "EXPERTS_FILE",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "RECORD_ALIGN",
    "RESIDENT_FILE",
    "Manifest",
    "RecordField",
]
