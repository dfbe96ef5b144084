"""How many threads a kernel call splits over, per phase: timed once at first use and cached
beside the unit's choice (docs/kernels.md, "Threads")."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from time import perf_counter
from types import ModuleType

import mlx.core as mx
import structlog

from edge0.kernels import isa

log = structlog.get_logger("edge0.kernels")

PHASES = ("decode", "prompt")  # a decode step's calls (one row) and a prompt chunk's (many)
MAX_THREADS = 4  # counts timed: 1 .. min(the CPUs this process may use, MAX_THREADS)
ROUNDS = 15  # interleaved rounds per count, after one uncounted warm-up round (~0.1 s in all)
# more threads must take at most 1 - MARGIN of the best fewer count's time; a decode step's
# bar is higher: its timing runs with the readers idle, and in a streamed run they share the
# cores (docs/benchmarks/kernels.md: a second thread gained a resident run up to a third, a
# streamed run nothing)
MARGIN = {"decode": 0.15, "prompt": 0.10}
PROMPT_ROWS = 16  # the prompt case's input rows: a GEMM (from 8 rows), 67M multiply-adds
CACHE_NAME = "kernels-threads.json"  # in the edge0 cache, beside the unit's (isa.CACHE_NAME)


def cache_file() -> Path:
    """Where the choice is kept: beside the unit's choice (isa.cache_file)."""
    return isa.cache_file().with_name(CACHE_NAME)


def counts_here() -> tuple[int, ...]:
    """The thread counts worth timing on this machine."""
    return tuple(range(1, min(len(os.sched_getaffinity(0)), MAX_THREADS) + 1))


def time_counts(
    mod: ModuleType, phase: str, counts: Sequence[int], rounds: int = ROUNDS
) -> dict[int, list[float]]:
    """Seconds of one pass of the phase's int4 products per thread count and round, the counts
    interleaved in each round: a decode step's one row, or a prompt chunk's `PROMPT_ROWS` rows,
    through isa's 2.5 MiB of weights (two 1024 x 2048 matrices: 256 KiB a thread up to 4),
    each pass from memory (`isa.cold`). Leaves the count in use as it found it."""
    first = mod.threads()
    got: dict[int, list[float]] = {n: [] for n in counts}
    try:
        with mx.stream(mx.cpu):  # the kernels' only device, whatever the default one is
            x, mats = isa.problem(PROMPT_ROWS if phase == "prompt" else 1)
            for _ in range(rounds + 1):  # the first round warms up the pool's workers, uncounted
                for n in counts:
                    mod.set_threads(n)
                    isa.cold(mod, mats)
                    t0 = perf_counter()
                    mx.eval([mod.qmm(x, w, s, b, 64, 4, "affine") for w, s, b in mats])
                    got[n].append(perf_counter() - t0)
    finally:
        mod.set_threads(first)
    return {n: v[1:] for n, v in got.items()}


def pick(times: Mapping[int, list[float]], margin: float = MARGIN["prompt"]) -> int:
    """The fewest threads, unless more take at most `1 - margin` of the time of the best
    fewer count in the median round (per-round ratios to one thread: the load moves every
    count of a round alike)."""
    counts = sorted(times)

    def ratio(n: int) -> float:
        return statistics.median(t / o for t, o in zip(times[n], times[counts[0]], strict=True))

    best = counts[0]
    for n in counts[1:]:
        if ratio(n) <= (1 - margin) * ratio(best):
            best = n
    return best


def choose(
    mod: ModuleType,
    path: Path | None,
    forced: Mapping[str, int | None],
    counts: Sequence[int] | None = None,
) -> dict[str, int]:
    """Phase -> thread count: `forced[phase]` where given (the environment's), else the cached
    choice for this machine, unit and CPU count when `path` holds one, else timed now (with
    nothing else running on the kernels: at first use, before the engine's readers start)
    and written there."""
    runs = list(counts or counts_here())
    key = f"{isa.machine_key(mod)}|{mod.isa()}|threads {runs}"
    kept = isa.read_table(path, "threads").get(key)
    kept = kept if isinstance(kept, dict) else {}
    out: dict[str, int] = {}
    timed = False
    for phase in PHASES:
        given, entry = forced.get(phase), kept.get(phase)
        if given is not None:
            out[phase] = given
        elif isinstance(entry, dict) and entry.get("threads") in runs:
            out[phase] = int(entry["threads"])
        elif len(runs) < 2:
            out[phase] = runs[0]
        else:
            times = time_counts(mod, phase, runs)
            out[phase] = pick(times, MARGIN[phase])
            ms = {str(n): round(statistics.median(t) * 1e3, 3) for n, t in times.items()}
            log.info("kernels.threads_timed", phase=phase, threads=out[phase], median_ms=ms)
            kept[phase] = {"threads": out[phase], "median_ms": ms}
            timed = True
    if timed and path is not None:
        isa.write_table(path, key, kept, "threads")
    return out
