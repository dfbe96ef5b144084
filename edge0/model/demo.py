"""The model `edge0 run` uses when none is given: the shipped demo teacher, converted on first use.

The package ships a small qwen3_moe trained here on Python standard-library
source (`edge0/data/teacher/`, bf16 HF checkpoint, see docs/teacher.md). The
first `edge0 run` without MODEL converts it to the edge0 layout at int4 in the
cache directory (a few seconds); `edge0 convert` carries the shipped prerouter
heads along (token horizon: `prerouter.*`, route mode's prediction; layer horizon:
`prerouter-layer.*`, the deadline policy's; and LoRA adapters, when present), and
the run streams its experts from there. The conversion is atomic and keyed by a hash
of the shipped files, so a new release (new heads included) never reuses a stale
student. The cache directory itself is edge0.model.cache's (`cache_dir` is re-exported
here for older callers).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from edge0.errors import ConversionError, ModelLoadError
from edge0.layout.manifest import MANIFEST_FILE
from edge0.log import get_logger
from edge0.model.cache import cache_dir, sweep

log = get_logger(__name__)
__all__ = ["cache_dir", "default_model_path", "teacher_path"]

DATA_DIR = Path(__file__).parent.parent / "data"
TEACHER_DIR = DATA_DIR / "teacher"  # + prerouter{,-layer}.safetensors/.json, optional adapters/


def teacher_path() -> Path:
    """The shipped demo teacher (HF format, bf16)."""
    if not (TEACHER_DIR / "model.safetensors").is_file():
        raise ModelLoadError(
            f"the demo model is missing from {TEACHER_DIR}; reinstall edge0 or pass a MODEL path"
        )
    return TEACHER_DIR


def _fingerprint(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.relative_to(DATA_DIR).as_posix().encode())
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def _shipped_files() -> list[Path]:
    return [p for p in TEACHER_DIR.rglob("*") if p.is_file()]


def default_model_path() -> Path:
    """The demo student for `edge0 run`: the shipped teacher converted to the edge0 layout.

    The cache is checked first (edge0.model.cache) and swept of what killed builds left; the
    conversion is atomic (edge0.layout.atomic), and of two processes converting at once the
    first to finish wins, the other uses its output."""
    from edge0.layout.convert import convert

    teacher = teacher_path()
    root = cache_dir()
    sweep(root)
    target = root / f"demo-student-{_fingerprint(_shipped_files())}"
    if (target / MANIFEST_FILE).is_file():
        return target
    log.info("demo.convert", source=str(teacher), target=str(target))
    try:
        convert(teacher, target)
    except ConversionError:
        if not (target / MANIFEST_FILE).is_file():  # not another process's finished output
            raise
    return target
