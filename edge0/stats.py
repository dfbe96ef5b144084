"""Generation statistics: speed, peak MLX memory, RSS read from /proc, the first stats line."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import attrs
import mlx.core as mx

_MIB = 1 << 20
_STATUS = Path("/proc/self/status")


def proc_field(path: Path, key: str) -> int:
    """Bytes of a "Key:  N kB" line of a /proc file (status, meminfo); 0 where it is missing."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (VmHWM on Linux, ru_maxrss elsewhere)."""
    got = proc_field(_STATUS, "VmHWM:")
    if got:
        return got
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # bytes on macOS


def current_rss_bytes() -> int:
    """Resident set size of this process now (VmRSS on Linux; the peak elsewhere)."""
    return proc_field(_STATUS, "VmRSS:") or peak_rss_bytes()


def peak_mlx_bytes() -> int:
    """Peak MLX memory since the last `mx.reset_peak_memory()`, never below current use.

    `mx.reset_peak_memory()` sets the peak to 0 rather than to the memory in use
    (measured), so the active memory is taken into account too.
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
        return speed_line(
            self.prompt_tokens,
            self.prompt_tps,
            self.decode_tokens,
            self.decode_tps,
            self.peak_mlx_bytes,
            self.peak_rss_bytes,
        )


def speed_line(
    prompt_tokens: int,
    prompt_tps: float,
    decode_tokens: int,
    decode_tps: float,
    peak_mlx: int,
    peak_rss: int,
) -> str:
    """The stats line every generation path prints first (resident and streamed alike)."""
    return (
        f"prompt: {prompt_tokens} tok, {prompt_tps:.1f} tok/s | "
        f"decode: {decode_tokens} tok, {decode_tps:.1f} tok/s | "
        f"peak MLX memory: {peak_mlx / _MIB:.1f} MiB | peak RSS: {peak_rss / _MIB:.1f} MiB"
    )
