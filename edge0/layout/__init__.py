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
from edge0.layout.records import FIELD_NAMES, RecordSpec, field_views, pack_record, record_layout

__all__ = [
    "EXPERTS_FILE",
    "FIELD_NAMES",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "RECORD_ALIGN",
    "RESIDENT_FILE",
    "Manifest",
    "RecordField",
    "RecordSpec",
    "field_views",
    "pack_record",
    "record_layout",
]
