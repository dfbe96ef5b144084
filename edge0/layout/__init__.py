"""The edge0 checkpoint layout: manifest, expert records, conversion and verification."""

from edge0.layout.manifest import EXPERTS_FILE, MANIFEST_FILE, RESIDENT_FILE, Manifest
from edge0.layout.manifest_checks import FORMAT_VERSION
from edge0.layout.records import (
    FIELD_NAMES,
    RECORD_ALIGN,
    RecordField,
    RecordSpec,
    field_views,
    pack_record,
    record_layout,
)

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
