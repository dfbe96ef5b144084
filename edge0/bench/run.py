"""`edge0 bench run`: decode modes x routing capacity K x tier stacks, interleaved, medians
(docs/benchmarks/index.md, "How the harness measures": rounds, isolation, peaks, watchdog).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge0.bench.llama_peer import Peer
from edge0.bench.worker import measure
from edge0.errors import ConfigError
from edge0.stats import proc_field

_MIB = 1 << 20
_GIB = 1 << 30
ISOLATION = ("subprocess", "process")
# (summary key, column header, format, scale)
COLUMNS = [
    ("decode_tps", "decode tok/s", "{:.2f}", 1.0),
    ("prefill_tps", "prefill tok/s", "{:.2f}", 1.0),
    ("prefill_bytes_per_token", "prefill MiB/prompt tok", "{:.2f}", 1 / _MIB),
    ("prefill_blocked_ms", "prefill blocked ms", "{:.0f}", 1.0),
    ("first_decode_blocked_ms", "1st decode blocked ms", "{:.1f}", 1.0),
    ("blocked_ms_per_step", "blocked ms/step", "{:.1f}", 1.0),
    ("compute_ms_per_step", "compute ms/step", "{:.1f}", 1.0),
    ("syncs_per_token", "host syncs/token", "{:.1f}", 1.0),
    ("cpu_ms_per_step", "process CPU ms/step", "{:.1f}", 1.0),
    ("bytes_per_token", "MiB/token", "{:.2f}", 1 / _MIB),
    ("route_recall", "true top-K recall", "{:.3f}", 1.0),
    ("read_bytes_per_s", "read MB/s", "{:.0f}", 1e-6),
    ("slot_hit_rate", "staged hit", "{:.2f}", 1.0),
    ("cache_hit_rate", "cache hit", "{:.2f}", 1.0),
    ("overlap_efficiency", "overlap eff.", "{:.2f}", 1.0),
    ("prefetch_width", "prefetch width", "{:.0f}", 1.0),
    ("tickets_consumed", "reads consumed", "{:.0f}", 1.0),
    ("tickets_wasted", "reads wasted", "{:.0f}", 1.0),
    ("peak_mlx_bytes", "peak MLX MiB", "{:.0f}", 1 / _MIB),
    ("gen_peak_rss_bytes", "peak RSS gen. MiB", "{:.0f}", 1 / _MIB),
    ("peak_rss_bytes", "peak RSS run MiB", "{:.0f}", 1 / _MIB),
]


@attrs.frozen
class Variant:
    """One configuration: decode mode, routing capacity K (None: the model's), tier stack."""

    mode: str
    k: int | None
    tiers: str  # ignored (and shown as "-") for resident
    predictor: str = "init"
    prefill_chunk: int | None = None  # prompt tokens per forward; None: the engine's default
    policy: str = "predicted"  # route mode's --route-policy
    deadline_ms: float | None = None  # its --route-deadline-ms (None: the engine's default)
    kernels: str = "native"  # "mlx": EDGE0_NATIVE_KERNELS=0 (MLX's own ops, edge0.kernels)
    sync_every: int | None = None  # route mode's --sync-every (None: the engine's default)
    width: int | str | None = None  # hint's --prefetch-width (None: the engine's default)

    @property
    def label(self) -> str:
        k = f"K={self.k}" if self.k is not None else "K=model"
        pred = f" ({self.predictor})" if self.mode in ("hint", "route") else ""
        if self.mode == "route" and (self.policy != "predicted" or self.deadline_ms is not None):
            pred += f" {self.policy}" + (
                "" if self.deadline_ms is None else f" {self.deadline_ms:g}ms"
            )
        tiers = "-" if self.mode == "resident" else self.tiers
        chunk = "" if self.prefill_chunk is None else f" chunk={self.prefill_chunk}"
        ops = "" if self.kernels == "native" else f" [{self.kernels} ops]"
        sync = "" if self.sync_every is None else f" sync={self.sync_every}"
        width = "" if self.width is None else f" width={self.width}"
        return f"{self.mode}{pred} {k}{chunk}{sync}{width}{ops} @ {tiers}"


@attrs.frozen
class BenchOptions:
    """How each run is made (the flags of `edge0 bench run` / `sweep`)."""

    model: Path
    prompts: int = 2
    prompt_len: int = 16
    tokens: int = 16
    repeats: int = 3
    warmup_tokens: int = 4
    isolate: str = "subprocess"
    cold: bool = False
    # Engine.open's keywords that hold for every variant (memory_budget, first_layer,
    # io_workers): given ones only, so the engine's declared defaults apply to the rest
    engine: dict[str, Any] = attrs.field(factory=dict)
    timeout_s: float = 900.0
    mem_floor: int = int(1.5 * _GIB)

    def check(self) -> None:
        if self.isolate not in ISOLATION:
            raise ConfigError(f"--isolate must be one of {', '.join(ISOLATION)}")
        for name in ("prompts", "prompt_len", "tokens", "repeats"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")


def make_variants(
    modes: Sequence[str],
    ks: Sequence[int | None],
    tiers: Sequence[str],
    predictors: Sequence[str] = ("init",),
    chunks: Sequence[int | None] = (None,),
    policies: Sequence[str] = ("predicted",),
    deadline_ms: float | None = None,
    kernels: Sequence[str] = ("native",),
    sync_every: Sequence[int | None] = (None,),
    widths: Sequence[int | str | None] = (None,),
) -> list[Variant]:
    """modes x K x tier stacks x prefill chunks x kernels, hint and route x predictors,
    route x route policies x --sync-every values, and hint x prefetch widths (resident
    once per K: it reads nothing)."""
    from edge0.options.engine import MODES

    out: list[Variant] = []
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        for k in ks:
            for spec in tiers[:1] if mode == "resident" else tiers:
                for pol in policies if mode == "route" else ("predicted",):
                    dl = deadline_ms if pol != "predicted" else None
                    out += [
                        Variant(mode, k, spec, pred, c, pol, dl, kern, g, wd)
                        for pred in (predictors if mode in ("hint", "route") else predictors[:1])
                        for g in (sync_every if mode == "route" else (None,))
                        for wd in (widths if mode == "hint" else (None,))
                        for c in chunks
                        for kern in kernels
                    ]
    return out


def make_job(v: Variant, opts: BenchOptions, rnd: int, trace: str | None = None) -> dict[str, Any]:
    return {
        "label": v.label,
        "round": rnd,
        "model": str(opts.model),
        "mode": v.mode,
        "k": v.k,
        "tiers": v.tiers,
        "predictor": v.predictor,
        "prompts": opts.prompts,
        "prompt_len": opts.prompt_len,
        "tokens": opts.tokens,
        "warmup_tokens": opts.warmup_tokens,
        "cold": opts.cold,
        "engine": opts.engine,
        "trace": trace,
        "prefill_chunk": v.prefill_chunk,
        "route_policy": v.policy,
        "route_deadline_ms": v.deadline_ms,
        "kernels": v.kernels,
        "sync_every": v.sync_every,
        "prefetch_width": v.width,
    }


def mem_available() -> int:
    """MemAvailable of the machine in bytes (a large number where /proc is missing)."""
    got = proc_field(Path("/proc/meminfo"), "MemAvailable:")
    return got if got else 1 << 62


def run_subprocess(job: dict[str, Any], timeout_s: float, mem_floor: int) -> dict[str, Any]:
    """Run `job` in `python -m edge0.bench.worker`, watched for time and memory."""
    with tempfile.TemporaryDirectory(prefix="edge0-bench-") as tmp:
        src, dst, err = Path(tmp, "job.json"), Path(tmp, "result.json"), Path(tmp, "stderr")
        src.write_text(json.dumps(job))
        start = time.perf_counter()
        max_rss, stopped = 0, None
        with err.open("w") as ef:
            proc = subprocess.Popen(
                [sys.executable, "-m", "edge0.bench.worker", str(src), str(dst)],
                stdout=subprocess.DEVNULL,
                stderr=ef,
            )
            status = Path(f"/proc/{proc.pid}/status")
            while proc.poll() is None:
                time.sleep(0.1)
                rss = proc_field(status, "VmRSS:")
                max_rss = max(max_rss, rss)
                elapsed = time.perf_counter() - start
                if elapsed > timeout_s:
                    stopped = f"stopped after the {timeout_s:.0f} s timeout"
                elif mem_available() < mem_floor:
                    stopped = (
                        f"stopped by the memory guard: MemAvailable fell below "
                        f"{mem_floor / _GIB:.1f} GiB at RSS {rss / _GIB:.2f} GiB "
                        f"after {elapsed:.0f} s"
                    )
                if stopped:
                    proc.kill()
                    proc.wait()
                    break
        wall = time.perf_counter() - start
        if stopped is None and dst.is_file():
            result: dict[str, Any] = json.loads(dst.read_text())
        else:
            tail = err.read_text().strip().splitlines()[-3:]
            why = stopped or f"worker exited with {proc.returncode}: {' | '.join(tail)}"
            result = {
                "label": job["label"],
                "round": job["round"],
                "error": why,
                "rss_method": "subprocess",
            }
        result["process_wall_s"] = wall
        result["rss_polled_max_bytes"] = max_rss
        return result


def run_one(job: dict[str, Any], opts: BenchOptions) -> dict[str, Any]:
    if opts.isolate == "process":
        return measure(job)
    return run_subprocess(job, opts.timeout_s, opts.mem_floor)


def run_rounds(
    variants: Sequence[Variant],
    opts: BenchOptions,
    progress: Callable[[int, Variant, dict[str, Any]], None] | None = None,
    peer: Peer | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """`repeats` rounds, each running every variant once in the given order (then `peer`'s
    llama.cpp, under its label); label -> runs."""
    opts.check()
    runs: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    if len(runs) != len(variants):
        raise ConfigError("the variants are not distinct")
    if peer is not None:
        runs[peer.label] = []
    for rnd in range(opts.repeats):
        for v in variants:
            res = run_one(make_job(v, opts, rnd), opts)
            res["seq"] = sum(len(r) for r in runs.values())
            runs[v.label].append(res)
            if progress is not None:
                progress(rnd, v, res)
        if peer is not None:
            res = peer.decode(opts.prompt_len, opts.tokens, opts.prompts, opts.timeout_s)
            res.update(label=peer.label, round=rnd, seq=sum(len(r) for r in runs.values()))
            runs[peer.label].append(res)
    return runs


def peer_ratios(variants: Sequence[Variant], runs: dict[str, list[dict[str, Any]]]) -> list[dict]:
    """Decode tok/s of each variant over llama.cpp's in the same round, and their median."""
    theirs = {r["round"]: r.get("decode_tps") for r in runs.get(Peer.label, [])}
    out = []
    for v in variants:
        per = [
            r["summary"]["decode_tps"] / theirs[r["round"]]
            for r in runs[v.label]
            if not r.get("error") and theirs.get(r["round"])
        ]
        if per:
            out.append(
                {
                    "variant": v.label,
                    "over": f"{Peer.label} (same round)",
                    "key": "decode_tps",
                    "per_round": per,
                    "median": statistics.median(per),
                }
            )
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max of every summary figure over the runs that did not fail."""
    ok = [r["summary"] for r in runs if not r.get("error") and r.get("summary")]
    errors = sorted({r["error"] for r in runs if r.get("error")})
    if not ok:
        return {"runs_ok": 0, "errors": errors}
    keys = ok[0].keys()
    med = {k: statistics.median(s[k] for s in ok) for k in keys}
    lo = {k: min(s[k] for s in ok) for k in keys}
    hi = {k: max(s[k] for s in ok) for k in keys}
    spread = (
        (hi["decode_tps"] - lo["decode_tps"]) / 2 / med["decode_tps"] if med["decode_tps"] else 0.0
    )
    return {
        "runs_ok": len(ok),
        "errors": errors,
        "median": med,
        "min": lo,
        "max": hi,
        "decode_spread": spread,
    }


def paired_ratios(
    variants: Sequence[Variant],
    runs: dict[str, list[dict[str, Any]]],
    base_of: Callable[[Variant], Variant | None],
    key: str,
) -> list[dict[str, Any]]:
    """`key` of each variant over its base variant (`base_of`; None: no base), per round
    (the rounds ran interleaved) and their median."""
    out = []
    for v in variants:
        base = base_of(v)
        if base is None or base.label not in runs:
            continue
        per_round = [
            a["summary"][key] / b["summary"][key]
            for a, b in zip(runs[v.label], runs[base.label], strict=True)
            if a.get("summary") and b.get("summary") and b["summary"][key]
        ]
        if per_round:
            out.append(
                {
                    "variant": v.label,
                    "over": base.label,
                    "per_round": per_round,
                    "median": statistics.median(per_round),
                }
            )
    return out


def ratios(variants: Sequence[Variant], runs: dict[str, list[dict[str, Any]]]) -> list[dict]:
    """Decode tok/s of hint/route over reactive at the same K and tiers: per-round and median."""
    return paired_ratios(
        variants,
        runs,
        lambda v: attrs.evolve(v, mode="reactive") if v.mode in ("hint", "route") else None,
        "decode_tps",
    )


def policy_ratios(variants: Sequence[Variant], runs: dict[str, list[dict[str, Any]]]) -> list[dict]:
    """Decode tok/s and process CPU per step of each route policy over `predicted` at the same
    K, tiers and chunk: per round and median (the issue-19 speed comparison)."""

    def base(v: Variant) -> Variant | None:
        if v.mode != "route" or (v.policy == "predicted" and v.deadline_ms is None):
            return None
        return attrs.evolve(v, policy="predicted", deadline_ms=None)

    out = paired_ratios(variants, runs, base, "decode_tps")
    for r in paired_ratios(variants, runs, base, "cpu_ms_per_step"):
        out.append({**r, "key": "cpu_ms_per_step"})
    return out


def sync_ratios(variants: Sequence[Variant], runs: dict[str, list[dict[str, Any]]]) -> list[dict]:
    """Decode tok/s and blocked ms per step of each route --sync-every value over the first
    one listed, at the same K, tiers, policy and chunk: per round and median."""
    firsts: dict[Variant, int | None] = {}
    for v in variants:
        firsts.setdefault(attrs.evolve(v, sync_every=None), v.sync_every)

    def base(v: Variant) -> Variant | None:
        first = firsts[attrs.evolve(v, sync_every=None)]
        if v.mode != "route" or v.sync_every is None or v.sync_every == first:
            return None
        return attrs.evolve(v, sync_every=first)

    out = paired_ratios(variants, runs, base, "decode_tps")
    for r in paired_ratios(variants, runs, base, "blocked_ms_per_step"):
        out.append({**r, "key": "blocked_ms_per_step"})
    return out


def markdown(variants: Sequence[Variant], summaries: dict[str, dict[str, Any]]) -> str:
    """The results table: medians over rounds, decode spread as +-half the min-max range."""
    head = ["variant", "runs"] + [h for _, h, _, _ in COLUMNS[:1]] + ["spread"]
    head += [h for _, h, _, _ in COLUMNS[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in variants:
        s = summaries[v.label]
        if not s["runs_ok"]:
            lines.append(f"| {v.label} | 0 | failed: {'; '.join(s['errors'])} |")
            continue
        med = s["median"]
        cells = [
            fmt.format(med[key] * scale) if key in med else "-" for key, _, fmt, scale in COLUMNS
        ]
        cells.insert(1, f"±{100 * s['decode_spread']:.0f}%")
        lines.append(f"| {v.label} | {s['runs_ok']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_lines(rs: list[dict]) -> str:
    lines = []
    for r in rs:
        a, _, tiers = r["variant"].partition(" @ ")
        b, _, base_tiers = r["over"].partition(" @ ")
        what = f"{a} / {b} @ {tiers}" if tiers == base_tiers else f"{r['variant']} / {r['over']}"
        rounds = ", ".join(f"{x:.2f}" for x in r["per_round"])
        key = {
            "cpu_ms_per_step": "process CPU ms/step",
            "blocked_ms_per_step": "blocked ms/step",
        }.get(r.get("key", ""), "decode tok/s")
        lines.append(f"- {what}: {r['median']:.2f}x {key} (median of per-round ratios {rounds})")
    return "\n".join(lines)


def report(
    variants: Sequence[Variant],
    opts: BenchOptions,
    runs: dict[str, list[dict[str, Any]]],
    command: str = "",
) -> dict[str, Any]:
    """Everything a result file holds: options, run order, per-run results, medians, ratios."""
    summaries = {v.label: summarise(runs[v.label]) for v in variants}
    order = sorted((r["seq"], r["label"], r["round"]) for rs in runs.values() for r in rs)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {
        "command": command,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in attrs.asdict(opts).items()},
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_end": load,
            "mem_available_end": mem_available(),
        },
        "variants": [
            {**attrs.asdict(v), "label": v.label, **summaries[v.label], "runs": runs[v.label]}
            for v in variants
        ],
        "order": [{"seq": s, "label": lab, "round": r} for s, lab, r in order],
        "ratios": ratios(variants, runs),
        "policy_ratios": policy_ratios(variants, runs),
        "sync_ratios": sync_ratios(variants, runs),
        "table": markdown(variants, summaries),
    }


def calibrate(
    opts: BenchOptions, k: int | None, io_ratio: float, lat: str = "100us"
) -> tuple[str, dict[str, Any]]:
    """A throttle stack whose per-step read time is `io_ratio` x per-step compute for reactive.

    One reactive run over the page cache (`pread`) measures decode compute ms/step
    and bytes read per decode step; bandwidth = bytes / (compute x io_ratio).
    Returns the spec and the calibration run's summary.
    """
    job = make_job(Variant("reactive", k, "pread"), attrs.evolve(opts, prompts=1, cold=False), 0)
    res = run_one(job, opts)
    if res.get("error"):
        raise ConfigError(f"calibration run failed: {res['error']}")
    s = res["summary"]
    if s["compute_ms_per_step"] <= 0 or s["decode_bytes_per_step"] <= 0:
        raise ConfigError("calibration run read nothing; is the model streamed?")
    bw = s["decode_bytes_per_step"] / (s["compute_ms_per_step"] / 1e3 * io_ratio)
    return f"throttle:bw={bw / 1e6:.1f}MB/s,lat={lat}>pread", s
