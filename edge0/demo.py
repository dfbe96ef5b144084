"""The model `edge0 run` uses when none is given (a tiny random one, built once)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from edge0.log import get_logger

log = get_logger(__name__)

# Bump when the tiny model's recipe changes so stale caches are rebuilt.
_DEMO_NAME = "tiny-qwen3_5_moe-v1"


def cache_dir() -> Path:
    """Where Edge0 keeps generated files: $EDGE0_CACHE, else $XDG_CACHE_HOME/edge0."""
    if env := os.environ.get("EDGE0_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge0"


def default_model_path() -> Path:
    """The default model directory for `edge0 run`.

    Until a trained demo model ships with the package, this is a tiny random
    qwen3_5_moe checkpoint (Gated DeltaNet + gated attention + shared expert, 8
    experts) built on first use into `cache_dir()`; its output is gibberish but
    exercises the whole path.
    """
    target = cache_dir() / _DEMO_NAME
    if (target / "config.json").exists():
        return target
    from edge0.tiny import TinySpec, write_checkpoint

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        write_checkpoint(TinySpec(model_type="qwen3_5_moe", max_positions=4096), tmp)
        try:
            tmp.rename(target)  # atomic: concurrent builders never see a partial model
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("demo.built", path=str(target))
    return target
