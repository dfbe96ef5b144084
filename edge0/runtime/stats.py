"""Generation statistics: prompt and decode speed, peak MLX memory, peak process RSS."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import attrs
import mlx.core as mx

_MIB = 1 << 20


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (VmHWM on Linux, ru_maxrss elsewhere)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # bytes on macOS


def current_rss_bytes() -> int:
    """Resident set size of this process now (VmRSS on Linux; the peak elsewhere)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return peak_rss_bytes()


def peak_mlx_bytes() -> int:
    """Peak MLX memory since the last `mx.reset_peak_memory()`, never below current use.

    `mx.reset_peak_memory()` sets the peak to 0 rather than to the memory in use
    (FACTS.md), so the active memory is taken into account too.
    """
    return max(int(mx.get_peak_memory()), int(mx.get_active_memory()))


@attrs.define
class GenerationStats:
    """Counters and timings of one generation (seconds, bytes)."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    peak_mlx_bytes: int = 0
    peak_rss_bytes: int = 0
    finish_reason: str = ""  # "stop" (end-of-sequence token) or "length" (max tokens)

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def line(self) -> str:
        """The one-line summary `edge0 run` prints after the text."""
        return (
            f"prompt: {self.prompt_tokens} tok, {self.prompt_tps:.1f} tok/s | "
            f"decode: {self.decode_tokens} tok, {self.decode_tps:.1f} tok/s | "
            f"peak MLX memory: {self.peak_mlx_bytes / _MIB:.1f} MiB | "
            f"peak RSS: {self.peak_rss_bytes / _MIB:.1f} MiB"
        )
