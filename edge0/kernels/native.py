"""Loading the native extension once, its settings from the environment, and its status line.

- `EDGE0_NATIVE_KERNELS=0`: never use the native kernels (MLX's own ops run).
- `EDGE0_KERNEL_THREADS=N`: threads per kernel call of a decode step, and
  `EDGE0_PROMPT_THREADS=N` over a prompt chunk (`prompt_threads`); otherwise each phase's
  fastest count here, timed once and cached (edge0.kernels.threads).
- `EDGE0_KERNEL_ISA=avx512|avx2|neon|portable`: force one row-kernel variant (otherwise the
  fastest here, timed once and cached: edge0.kernels.isa).
- `EDGE0_INT8_ACTIVATIONS=1`: opt-in, not exact: x quantized to int8 per block of 32 for
  the 4-bit matrices (docs/kernels.md: its cost in KL against the teacher). Where the row
  kernel in use has no int8 path, float32 runs and the status line says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType

import mlx.core as mx
import structlog

from edge0.kernels import isa as units
from edge0.kernels import threads

log = structlog.get_logger("edge0.kernels")

_state: dict[str, object] = {}
_THREAD_VARS = {"decode": "EDGE0_KERNEL_THREADS", "prompt": "EDGE0_PROMPT_THREADS"}


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
    forced: dict[str, int | None] = {}
    for phase, var in _THREAD_VARS.items():
        value = os.environ.get(var, "").strip()
        try:
            forced[phase] = int(value) if value else None
        except ValueError:
            return None, f"{var}={value!r} is not a whole number"
        if value and not 1 <= int(value) <= 64:
            return None, f"{var}={value} is outside 1..64"
    _native.set_int8_inputs(int8_asked())
    if not isa:  # the unit this machine runs fastest, timed at first use (isa.py)
        units.choose(_native, units.cache_file())
    counts = threads.choose(_native, threads.cache_file(), forced)  # per phase, timed or cached
    _native.set_threads(counts["decode"])
    _state["prompt_threads"] = counts["prompt"]
    return _native, ""


def _int8_setting() -> tuple[bool, str]:
    """`EDGE0_INT8_ACTIVATIONS` read once: (on, "") or (False, why a value is refused)."""
    raw = os.environ.get("EDGE0_INT8_ACTIVATIONS", "0")
    value = raw.strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True, ""
    if value in ("", "0", "off", "false", "no"):
        return False, ""
    return False, f"EDGE0_INT8_ACTIVATIONS={raw!r} is neither 1 nor 0: float32 runs"


def int8_asked() -> bool:
    """Whether `EDGE0_INT8_ACTIVATIONS` asks for int8 inputs to the 4-bit matrices."""
    return _int8_setting()[0]


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
            log.info(
                "kernels.native",
                isa=mod.isa(),
                isa_mxfp4=mod.isa("mxfp4"),
                threads=mod.threads(),
                prompt_threads=_state["prompt_threads"],
                int8_activations=mod.int8_inputs(),
            )
            if int8_asked() and not mod.int8_inputs():
                log.warning("kernels.int8_unavailable", isa=mod.isa(), runs="float32")
            refused = _int8_setting()[1]
            if refused:
                log.warning("kernels.int8_refused", reason=refused)
    got = _state["module"]
    return got if isinstance(got, ModuleType) else None


@contextlib.contextmanager
def prompt_threads() -> Iterator[int]:
    """Meanwhile, a kernel call may split over `EDGE0_PROMPT_THREADS` threads: a prompt chunk
    is compute-bound and no decode step runs beside it (they share the compute thread).
    Yields the count; the decode steps' count comes back after."""
    mod = module()
    n = int(_state.get("prompt_threads", 1))  # type: ignore[call-overload]
    if mod is None or n == mod.threads():
        yield 1 if mod is None else n
        return
    before = mod.threads()
    mod.set_threads(n)
    try:
        yield n
    finally:
        mod.set_threads(before)


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
    n, p = mod.threads(), _state.get("prompt_threads", 1)
    line = f"kernels: native {units_line(mod)}, {n} thread{'s' if n != 1 else ''} (prompts {p})"
    if mod.int8_inputs():
        return line + ", int8 activations (EDGE0_INT8_ACTIVATIONS)"
    asked, refused = _int8_setting()
    if asked:
        return line + f" (int8 activations asked for: not built for {mod.isa()}, float32 runs)"
    return line + (f" ({refused})" if refused else "")


def units_line(mod: ModuleType) -> str:
    """The unit in use, and MXFP4's where it differs (each kind is timed: isa.py)."""
    affine, fp4 = mod.isa("affine"), mod.isa("mxfp4")
    return affine if affine == fp4 else f"{affine} (MXFP4: {fp4})"


def reset() -> None:
    """Forget the loaded state (tests change the environment and load again)."""
    _state.clear()
