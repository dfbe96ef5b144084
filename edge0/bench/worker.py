"""One benchmark run of one variant, in its own process (`python -m edge0.bench.worker JOB RESULT`):
open an Engine, warm up, decode a prompt set, summarise (docs/benchmarks/index.md).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from edge0.stats import peak_rss_bytes, proc_field

# A fixed prompt set (written for this benchmark); each is cut or repeated to the prompt length.
PROMPT_TEXTS = (
    "The river carried small boats of grain down to the market town every autumn.",
    "To sort a list of records by date, first parse each timestamp into a number.",
    "She opened the old notebook and found a map drawn in faded blue ink.",
    "A cache keeps recently used data close to the processor so reads are cheap.",
    "The committee met on Tuesday to discuss the budget for the new library wing.",
    "Mountains to the north kept the valley warm and sheltered from the wind.",
    "When the test failed, the engineer printed the inputs and ran it once more.",
    "Bread rises because yeast turns sugar into gas that the dough traps inside.",
)


def rss_bytes() -> int:
    """Current resident set size of this process (VmRSS), 0 where /proc is missing."""
    return proc_field(Path("/proc/self/status"), "VmRSS:")


def process_cpu_s() -> float:
    """CPU seconds of this process, all threads (MLX kernels, compute, loop, tier threads):
    less sensitive than wall time to other processes sharing the cores."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def reset_peak_rss() -> bool:
    """Set this process's VmHWM to its current RSS (Linux clear_refs "5"); False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def encode_prompts(tokenizer: Any, n: int, length: int) -> list[list[int]]:
    """`n` prompts of exactly `length` token ids from PROMPT_TEXTS (plain text, no template)."""
    out = []
    for i in range(n):
        ids = list(tokenizer.encode(PROMPT_TEXTS[i % len(PROMPT_TEXTS)]))
        ids = ids or [1]
        while len(ids) < length:
            ids = ids + ids
        out.append(ids[:length])
    return out


def combine(stats: list[dict[str, Any]]) -> dict[str, float]:
    """One row from the RunStats dicts of the prompts of a run (step-weighted means)."""
    gen = sum(s["generated_tokens"] for s in stats)
    prompt = sum(s["prompt_tokens"] for s in stats)
    tokens = gen + prompt

    def wmean(key: str, weight: str = "generated_tokens") -> float:
        w = sum(s[weight] for s in stats)
        return sum(s[key] * s[weight] for s in stats) / w if w else 0.0

    # decode steps: the first generated token comes out of the prefill's last step
    steps = sum(s["decode_steps"] for s in stats)
    decode_s = sum(s["decode_s"] for s in stats)
    prefill_s = sum(s["prefill_s"] for s in stats)
    recall_slots = sum(s.get("recall_slots", 0) for s in stats)
    recall = (
        {"route_recall": sum(s["recall_hits"] for s in stats) / recall_slots}
        if recall_slots
        else {}
    )  # only where the true sets were read
    widths = [s["prefetch_width"] for s in stats if s.get("prefetch_width") is not None]
    width = {"prefetch_width": float(widths[-1])} if widths else {}  # at the run's end
    return {
        **recall,
        **width,
        "decode_tps": steps / decode_s if decode_s > 0 else 0.0,
        "prefill_tps": prompt / prefill_s if prefill_s > 0 else 0.0,
        "blocked_ms_per_step": wmean("blocked_ms_per_step"),
        "compute_ms_per_step": wmean("compute_ms_per_step"),
        "syncs_per_token": wmean("syncs_per_token"),
        "overhead_ms_per_layer": wmean("overhead_ms_per_layer"),
        "overlap_efficiency": wmean("overlap_efficiency"),
        "bytes_per_token": sum(
            s["bytes_per_token"] * (s["generated_tokens"] + s["prompt_tokens"]) for s in stats
        )
        / tokens
        if tokens
        else 0.0,
        "decode_bytes_per_step": wmean("decode_bytes_per_step"),
        # bytes read per second of decode (decode steps: every generated token after the first)
        "read_bytes_per_s": sum(
            s["decode_bytes_per_step"] * max(s["generated_tokens"] - 1, 0) for s in stats
        )
        / decode_s
        if decode_s > 0
        else 0.0,
        "prefill_bytes_per_token": wmean("prefill_bytes_per_token", "prompt_tokens"),
        "first_decode_blocked_ms": wmean("first_decode_blocked_ms", "prompt_tokens"),
        "prefill_blocked_ms": wmean("prefill_blocked_ms", "prompt_tokens"),
        "slot_hit_rate": wmean("slot_hit_rate"),
        "cache_hit_rate": wmean("cache_hit_rate"),
        "tickets_wasted": float(sum(s["tickets_wasted"] for s in stats)),
        "tickets_consumed": float(sum(s["tickets_consumed"] for s in stats)),
        "tickets_issued": float(sum(s["tickets_issued"] for s in stats)),
        "peak_mlx_bytes": float(max(s["peak_mlx_bytes"] for s in stats)),
        "loop_max_lag_ms": max(s["loop_max_lag_ms"] for s in stats),
        "generated_tokens": float(gen),
        "prompt_tokens": float(prompt),
    }


def use_kernels(which: str) -> None:
    """native (or native:N, N threads per call): the native CPU kernels where they run;
    native-int8: the same with int8 activations (EDGE0_INT8_ACTIVATIONS); mlx: MLX's own
    ops (edge0.kernels)."""
    from edge0.kernels import native

    os.environ["EDGE0_NATIVE_KERNELS"] = "0" if which == "mlx" else "1"
    os.environ["EDGE0_INT8_ACTIVATIONS"] = "1" if which == "native-int8" else "0"
    if which.startswith("native:"):
        os.environ["EDGE0_KERNEL_THREADS"] = which.split(":", 1)[1]
    else:
        os.environ.pop("EDGE0_KERNEL_THREADS", None)
    native.reset()


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Run one variant as described by `job` (see edge0.bench.run.make_job); a result dict."""
    import mlx.core as mx

    from edge0 import log
    from edge0.bench.tiers import drop_page_cache
    from edge0.loop import run
    from edge0.runtime.engine.api import Engine

    log.configure(job.get("log_level", "warning"))
    use_kernels(job.get("kernels", "native"))
    gc.collect()
    mx.clear_cache()
    reset = reset_peak_rss()
    result: dict[str, Any] = {
        "label": job["label"],
        "round": job.get("round", 0),
        "error": None,
        "rss_before_bytes": rss_bytes(),
        "rss_method": job.get("rss_method", "clear_refs"),
        "vmhwm_reset": reset,
    }
    path = Path(job["model"])
    opts: dict[str, Any] = dict(
        mode=job["mode"],
        top_k=job["k"],
        predictor=job["predictor"],
        trace=job.get("trace"),
        **job.get("engine", {}),
    )
    if job["mode"] != "resident":
        opts["tiers"] = job["tiers"]
    for key in (
        "prefill_chunk",
        "route_policy",
        "route_deadline_ms",
        "sync_every",
        "prefetch_width",
    ):
        if job.get(key) is not None:
            opts[key] = job[key]

    async def go() -> None:
        t0 = time.perf_counter()
        async with Engine.open(path, **opts) as eng:
            result["load_s"] = time.perf_counter() - t0
            result["load_peak_rss_bytes"] = peak_rss_bytes()  # loading + start-up, VmHWM
            plan = eng.setup.memory_plan
            result["memory_plan"] = plan.line() if plan is not None else None
            if plan is not None and isinstance(opts.get("tiers"), str):
                from edge0.runtime.plan.memory import apply_to_spec

                result["tiers_used"] = apply_to_spec(opts["tiers"], plan.cache)
            prompts = encode_prompts(eng.tokenizer, job["prompts"], job["prompt_len"])
            if job.get("warmup_tokens", 0) > 0:  # MLX kernels, allocator, the tier's first reads
                async for _ in eng.tokens(
                    prompts[0][:4], max_tokens=job["warmup_tokens"], stop=False
                ):
                    pass
            # peak RSS of generation alone: drop what loading and warm-up left cached, reset VmHWM
            gc.collect()
            mx.clear_cache()
            result["pre_gen_peak_rss_bytes"] = peak_rss_bytes()  # load + warm-up
            result["gen_rss_start_bytes"] = rss_bytes()
            gen_reset = reset_peak_rss()
            stats = []
            decode_cpu = 0.0  # process CPU time (all threads) from each first token to the end
            for ids in prompts:
                if job.get("cold"):
                    drop_page_cache(path)
                c0: float | None = None
                async for _ in eng.tokens(ids, max_tokens=job["tokens"], stop=False):
                    c0 = process_cpu_s() if c0 is None else c0
                decode_cpu += process_cpu_s() - (c0 or process_cpu_s())
                assert eng.last_stats is not None
                stats.append(eng.last_stats.to_dict())
            result["stats"] = stats
            result["summary"] = combine(stats)
            steps = sum(s["decode_steps"] for s in stats)
            result["summary"]["cpu_ms_per_step"] = decode_cpu / steps * 1e3 if steps else 0.0
            if gen_reset:
                result["summary"]["gen_peak_rss_bytes"] = float(peak_rss_bytes())

    start = time.perf_counter()
    try:
        run(go())
    except Exception as exc:  # noqa: BLE001 - one failed variant must not end the benchmark
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["wall_s"] = time.perf_counter() - start
    # with the VmHWM reset above this is the generation peak; the load peak is kept below
    result["peak_rss_bytes"] = max(peak_rss_bytes(), result.get("pre_gen_peak_rss_bytes", 0))
    if result.get("summary") is not None:
        result["summary"]["peak_rss_bytes"] = float(result["peak_rss_bytes"])
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m edge0.bench.worker JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    job["rss_method"] = "subprocess"
    Path(argv[1]).write_text(json.dumps(measure(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
