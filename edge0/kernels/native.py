"""Loading the native extension once, its settings from the environment, and its status line.

- `EDGE0_NATIVE_KERNELS=0`: never use the native kernels (MLX's own ops run).
- `EDGE0_KERNEL_THREADS=N`: threads per kernel call (default `DEFAULT_THREADS`).
- `EDGE0_KERNEL_ISA=avx512|avx2|neon|portable`: force one row-kernel variant.
"""

from __future__ import annotations

import os
from types import ModuleType

import mlx.core as mx
import structlog

log = structlog.get_logger("edge0.kernels")

DEFAULT_THREADS = 1  # docs/benchmarks/kernels.md: 1 vs 2 threads with the readers running

_state: dict[str, object] = {}


def _load() -> tuple[ModuleType | None, str]:
    """(the module, "") or (None, why it is not used)."""
    if os.environ.get("EDGE0_NATIVE_KERNELS", "1").strip().lower() in ("0", "off", "false", "no"):
        return None, "EDGE0_NATIVE_KERNELS=0"
    try:
        from edge0.kernels import _native  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, f"the native extension is not built or did not load ({exc})"
    isa = os.environ.get("EDGE0_KERNEL_ISA", "").strip()
    if isa and not _native.use_isa(isa):
        return None, f"EDGE0_KERNEL_ISA={isa} is not built or not supported by this CPU"
    threads = os.environ.get("EDGE0_KERNEL_THREADS", "").strip()
    try:
        n = int(threads) if threads else DEFAULT_THREADS
    except ValueError:
        return None, f"EDGE0_KERNEL_THREADS={threads!r} is not a whole number"
    if not 1 <= n <= 64:
        return None, f"EDGE0_KERNEL_THREADS={n} is outside 1..64"
    _native.set_threads(n)
    return _native, ""


def module() -> ModuleType | None:
    """The loaded extension, or None when MLX's own ops must run (said once in the log)."""
    if "module" not in _state:
        mod, why = _load()
        _state["module"], _state["why"] = mod, why
        if mod is None:  # said once; a deliberate opt-out is not worth a warning
            quiet = why.startswith("EDGE0_NATIVE_KERNELS") or not on_cpu()
            level = log.info if quiet else log.warning
            level("kernels.fallback", reason=why, ops="MLX's own")
        else:
            log.info("kernels.native", isa=mod.isa(), threads=mod.threads())
    got = _state["module"]
    return got if isinstance(got, ModuleType) else None


def on_cpu() -> bool:
    """Whether graphs built now run on the CPU (the only place the native kernels run)."""
    return bool(mx.default_device() == mx.cpu)


def status() -> str:
    """One line: which kernels run matrix products on this machine, and why."""
    mod = module()
    if not on_cpu():
        return f"kernels: MLX's own ({mx.default_device()} device)"
    if mod is None:
        return f"kernels: MLX's own ops ({_state['why']})"
    n = mod.threads()
    return f"kernels: native {mod.isa()}, {n} thread{'s' if n != 1 else ''}"


def reset() -> None:
    """Forget the loaded state (tests change the environment and load again)."""
    _state.clear()
