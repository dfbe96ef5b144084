"""Which row-kernel unit runs for each kind of 4-bit matrix: the fastest here, timed once at
first use and cached (docs/kernels.md, "Variants and dispatch")."""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx
import structlog

log = structlog.get_logger("edge0.kernels")

UNITS = ("avx512", "avx2", "neon")  # widest first; `portable` runs where none of them can
KINDS = ("affine", "mxfp4")  # each kind of 4-bit matrix runs the unit timed fastest for it
ROUNDS = 15  # interleaved rounds of one pass over the matrices per unit
MARGIN = 0.03  # a narrower unit must beat the widest by this share to be chosen
CACHE_NAME = "kernels-isa.json"
# 2.5 MiB of int4 g64 with its scales: small, so the timing adds little to a process's peak
# RSS (40 MiB of it put a tight memory budget's run over its promise)
_ROWS, _COLS, _MATRICES = 1024, 2048, 2


def cache_file() -> Path:
    """Where the choice is kept: the edge0 cache ($EDGE0_CACHE, else $XDG_CACHE_HOME/edge0,
    else ~/.cache/edge0; the directory edge0.model.cache checks and creates)."""
    if env := os.environ.get("EDGE0_CACHE"):
        return Path(env).expanduser() / CACHE_NAME
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge0" / CACHE_NAME


def machine_key(mod: ModuleType) -> str:
    """The CPU, the extension build and MLX: a choice is kept for this triple only."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "CPU part")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    built = Path(str(mod.__file__)).stat()
    mlx = getattr(mx, "__version__", "?")
    return f"{cpu}|{platform.machine()}|{built.st_size}:{built.st_mtime_ns}|mlx {mlx}"


def problem(rows: int = 1) -> tuple[mx.array, list[tuple[mx.array, mx.array, mx.array]]]:
    """`rows` inputs and the timed int4 g64 matrices (weight, scales, biases), evaluated."""
    keys = mx.random.split(mx.random.key(0), 3 * _MATRICES + 1)
    mats = []
    for i in range(_MATRICES):
        kw, ks, kb = keys[3 * i], keys[3 * i + 1], keys[3 * i + 2]
        w = mx.random.randint(0, 2**31 - 1, (_ROWS, _COLS // 8), key=kw).astype(mx.uint32)
        s = mx.random.uniform(0.001, 0.01, (_ROWS, _COLS // 64), key=ks)
        b = mx.random.uniform(-0.05, 0.05, (_ROWS, _COLS // 64), key=kb)
        mats.append((w, s, b))
    x = mx.random.normal((rows, _COLS), key=keys[-1])
    mx.eval(x, mats)
    return x, mats


def time_units(
    mod: ModuleType, units: Sequence[str], rounds: int = ROUNDS, kind: str = "affine"
) -> dict[str, list[float]]:
    """Seconds of one pass of `kind`'s 4-bit products (one row, the decode case) per unit and
    round, the units interleaved in each round, each pass from memory (`cold`). Leaves the
    unit in use as it found it."""
    first = mod.isa(kind)
    got: dict[str, list[float]] = {u: [] for u in units}
    try:
        with mx.stream(mx.cpu):  # the kernels' only device, whatever the default one is
            x, mats = problem()
            calls, read = _calls(mod, kind, x, mats)
            for _ in range(rounds + 1):  # the first round warms up, uncounted
                for unit in units:
                    mod.use_isa(unit, kind)
                    cold(mod, read)
                    t0 = time.perf_counter()
                    mx.eval(calls())
                    got[unit].append(time.perf_counter() - t0)
    finally:
        mod.use_isa(first, kind)
    return {u: v[1:] for u, v in got.items()}


def cold(mod: ModuleType, mats: Sequence[tuple[mx.array, ...]]) -> bool:
    """Drop the timed weights from every cache level (the extension's `evict`, x86), so a pass
    reads them from memory as a decode step reads its weights: 2.5 MiB stays in this CPU's
    caches between passes, where the wider unit's lead in compute is smaller than its lead in
    streaming. False where the lines cannot be dropped (the pass then runs warm)."""
    evict = getattr(mod, "evict", None)
    return bool(evict([a for m in mats for a in m if a is not None])) if evict else False


def _calls(
    mod: ModuleType, kind: str, x: mx.array, mats: list[tuple[mx.array, mx.array, mx.array]]
) -> tuple[Callable[[], list[mx.array]], list[tuple[mx.array, ...]]]:
    """The kernel calls one timed pass makes, and the operands they read: the affine matrices
    as they are, or their codes as MXFP4 with e8m0 scales (2^-7 .. 2^-5) per group of 32 and
    no biases."""
    if kind == "affine":
        return lambda: [mod.qmm(x, w, s, b, 64, 4, "affine") for w, s, b in mats], list(mats)
    keys = mx.random.split(mx.random.key(1), len(mats))
    fp4 = [
        (w, mx.random.randint(120, 123, (w.shape[0], _COLS // 32), key=k).astype(mx.uint8))
        for (w, _, _), k in zip(mats, keys, strict=True)
    ]
    mx.eval(fp4)
    return lambda: [mod.qmm(x, w, e, None, 32, 4, "mxfp4") for w, e in fp4], list(fp4)


def pick(times: dict[str, list[float]], units: Sequence[str]) -> str:
    """The widest (first) unit, unless another takes `1 - MARGIN` of its time or less in
    the median round (per-round ratios: the load moves both units of a round alike)."""
    widest = units[0]

    def ratio(u: str) -> float:
        return statistics.median(t / w for t, w in zip(times[u], times[widest], strict=True))

    best = min(units, key=ratio)
    return best if ratio(best) <= 1 - MARGIN else widest


def choose(
    mod: ModuleType, path: Path | None, units: Sequence[str] | None = None
) -> dict[str, str]:
    """Switch `mod` to the fastest unit this CPU runs for each kind of 4-bit matrix (KINDS),
    and return kind -> unit: the cached choice for this machine when `path` holds one, else
    timed now and written there."""
    runs = [u for u in (units or UNITS) if _runs(mod, u)]
    if len(runs) < 2:
        one = str(mod.isa()) if not runs else runs[0]
        return {kind: _use(mod, one, kind) for kind in KINDS}
    key = machine_key(mod)
    kept = read_table(path).get(key)
    if isinstance(kept, dict) and kept.get("units") == runs:
        chosen = kept.get("unit")
        if isinstance(chosen, dict) and all(chosen.get(k) in runs for k in KINDS):
            return {kind: _use(mod, str(chosen[kind]), kind) for kind in KINDS}
    chosen, ms = {}, {}
    for kind in KINDS:
        times = time_units(mod, runs, kind=kind)
        chosen[kind] = pick(times, runs)
        ms[kind] = {u: round(statistics.median(t) * 1e3, 3) for u, t in times.items()}
        log.info("kernels.isa_timed", kind=kind, unit=chosen[kind], median_ms=ms[kind])
    if path is not None:
        write_table(path, key, {"unit": chosen, "units": runs, "median_ms": ms})
    return {kind: _use(mod, chosen[kind], kind) for kind in KINDS}


def _runs(mod: ModuleType, unit: str) -> bool:
    first = mod.isa()
    ok = bool(mod.use_isa(unit))
    mod.use_isa(first)
    return ok


def _use(mod: ModuleType, unit: str, kind: str) -> str:
    mod.use_isa(unit, kind)
    return unit


def read_table(path: Path | None, what: str = "isa") -> dict[str, Any]:
    """The cached choices in `path` (`what` names them in a warning); {} when none can be read."""
    if path is None or not path.exists():
        return {}
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        event = f"kernels.{what}_cache_unreadable"
        log.warning(event, path=str(path), error=str(exc), then="timed")
        return {}
    return got if isinstance(got, dict) else {}


def write_table(path: Path, key: str, entry: dict[str, Any], what: str = "isa") -> None:
    """Merge `entry` under `key`, atomically; a cache that cannot be written is only logged."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = read_table(path, what)
        table[key] = entry
        fd, tmp = tempfile.mkstemp(prefix=f".{what}-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning(f"kernels.{what}_cache_unwritable", path=str(path), error=str(exc))
