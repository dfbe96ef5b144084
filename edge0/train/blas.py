"""OpenBLAS detection: MLX's CPU fp32 matmul is several times faster with OpenBLAS on Linux."""

from __future__ import annotations

import sys
from pathlib import Path

# Debian/Ubuntu package libopenblas0-pthread.
OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
)


def openblas_loaded() -> bool:
    """True when an OpenBLAS library is mapped into this process (Linux only)."""
    try:
        return "libopenblas" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def openblas_hint() -> str | None:
    """A one-line tip for Linux CPU runs without OpenBLAS; None where it does not apply."""
    if not sys.platform.startswith("linux") or openblas_loaded():
        return None
    found = next((p for p in OPENBLAS_CANDIDATES if Path(p).exists()), None)
    if found is not None:
        return (
            f"tip: MLX fp32 matmul on the CPU is ~8x faster with OpenBLAS; rerun with "
            f"LD_PRELOAD={found}"
        )
    return (
        "tip: MLX fp32 matmul on the CPU is ~8x faster with OpenBLAS: install it "
        "(Debian/Ubuntu: apt-get install libopenblas0-pthread) and rerun with "
        "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
    )
