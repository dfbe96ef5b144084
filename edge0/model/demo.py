"""The model `edge0 run` uses when none is given: the shipped demo teacher, converted on first use.

The package ships a small qwen3_moe trained here on Python standard-library
source (`edge0/data/teacher/`, bf16 HF checkpoint, see docs/teacher.md). The
first `edge0 run` without MODEL converts it to the edge0 layout at int4 in the
cache directory (a few seconds); `edge0 convert` carries the shipped prerouter
heads along (token horizon: `prerouter.*`, route mode's prediction; layer horizon:
`prerouter-layer.*`, the deadline policy's; and LoRA adapters, when present), and
the run streams its experts from there. The conversion is atomic and keyed by a hash
of the shipped files, so a new release (new heads included) never reuses a stale
student.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from edge0.errors import ModelLoadError
from edge0.log import get_logger

log = get_logger(__name__)

DATA_DIR = Path(__file__).parent.parent / "data"
TEACHER_DIR = DATA_DIR / "teacher"  # + prerouter{,-layer}.safetensors/.json, optional adapters/


def cache_dir() -> Path:
    """Where Edge0 keeps generated files: $EDGE0_CACHE, else $XDG_CACHE_HOME/edge0."""
    if env := os.environ.get("EDGE0_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge0"


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
    """The demo student for `edge0 run`: the shipped teacher converted to the edge0 layout."""
    from edge0.layout.convert import convert

    teacher = teacher_path()
    target = cache_dir() / f"demo-student-{_fingerprint(_shipped_files())}"
    if (target / "edge0.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + f".build-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        log.info("demo.convert", source=str(teacher), target=str(target))
        convert(teacher, staging)  # atomic itself: staging only exists once complete
        try:
            staging.rename(target)  # concurrent builders: the first rename wins
        except OSError:
            if not (target / "edge0.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
