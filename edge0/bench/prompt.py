"""`edge0 bench prefill`: prompt tok/s, time to first token and bytes read per prompt token, each
variant in its own process (docs/benchmarks/prefill.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

KERNELS = ("native", "mlx")
PLAN = 0  # a variant's chunk left to the memory plan (`--chunks plan`, with --memory-budget)


@attrs.frozen
class Variant:
    kernels: str  # native | mlx
    chunk: int  # prompt tokens per forward (1: one token per step; PLAN: the memory plan's)
    threads: int | None = None  # EDGE0_PROMPT_THREADS; None: the engine's default

    @property
    def name(self) -> str:
        t = "" if self.threads is None else f" threads={self.threads}"
        return f"{self.kernels} chunk={'plan' if self.chunk == PLAN else self.chunk}{t}"


@attrs.frozen
class Job:
    model: str | None  # None: the demo model
    variant: Variant
    prompt_len: int
    prompts: int
    tokens: int
    tiers: str
    mode: str | None
    engine: dict[str, Any] = attrs.Factory(dict)  # more Engine.open options (memory_budget, ...)


def parse_variants(kernels: str, chunks: str, threads: str = "") -> list[Variant]:
    """ "native,mlx" x "256,1" (x "1,2" threads) -> the variants, refusing unknown kernels,
    bad chunks or thread counts; the chunk `plan` leaves it to the memory plan."""
    ks = [k.strip() for k in kernels.split(",") if k.strip()]
    bad = [k for k in ks if k not in KERNELS]
    if not ks or bad:
        raise ValueError(f"--kernels takes {','.join(KERNELS)}, not {kernels!r}")
    words = [c.strip() for c in chunks.split(",") if c.strip()]
    try:
        cs = [int(c) for c in words if c != "plan"]
    except ValueError:
        raise ValueError(f"--chunks takes integers like 256,1 or plan, not {chunks!r}") from None
    if not words or any(c < 1 for c in cs):
        raise ValueError(f"--chunks values must be at least 1, got {chunks!r}")
    cs = [PLAN if c == "plan" else int(c) for c in words]
    try:
        ts: list[int | None] = [int(t) for t in threads.split(",") if t.strip()] or [None]
    except ValueError:
        raise ValueError(f"--threads takes integers like 1,2, not {threads!r}") from None
    if any(t is not None and not 1 <= t <= 64 for t in ts):
        raise ValueError(f"--threads values must be within 1..64, got {threads!r}")
    return [Variant(k, c, t) for k in ks for c in cs for t in ts]


async def _measure(job: Job) -> dict[str, Any]:
    from edge0.bench.worker import encode_prompts, process_cpu_s
    from edge0.kernels.native import status
    from edge0.model.demo import default_model_path
    from edge0.runtime.engine.api import Engine
    from edge0.stats import peak_rss_bytes

    path = job.model or default_model_path()
    chunk = None if job.variant.chunk == PLAN else job.variant.chunk
    opts: dict[str, Any] = {**job.engine, "prefill_chunk": chunk, "tiers": job.tiers}
    if job.mode is not None:
        opts["mode"] = job.mode
    runs = []
    load_before = os.getloadavg()
    async with Engine.open(path, **opts) as eng:
        ids = encode_prompts(eng.tokenizer, job.prompts, job.prompt_len)
        async for _ in eng.tokens(ids[0][:16], max_tokens=2, stop=False):  # warm-up
            pass
        for prompt in ids:
            t0, c0 = time.perf_counter(), process_cpu_s()
            first, toks = None, []
            async for tok in eng.tokens(prompt, max_tokens=job.tokens, stop=False):
                first = time.perf_counter() - t0 if first is None else first
                toks.append(tok)
            s = eng.last_stats
            assert s is not None and first is not None
            runs.append(
                {
                    "prefill_s": s.prefill_s,
                    "ttft_s": first,
                    "prompt_tps": job.prompt_len / s.prefill_s,
                    "mib_per_prompt_token": s.prefill_bytes_per_token / 2**20,
                    "prefill_blocked_ms": s.prefill_blocked_ms,
                    "cpu_s": process_cpu_s() - c0,  # the prompt and its continuation
                    "tokens": toks,
                }
            )
        mode, used = eng.setup.ctx.mode, eng.setup.ctx.prefill_chunk
        planned = eng.setup.memory_plan
    return {
        "runs": runs,
        "mode": mode,
        "chunk": used,
        "plan": None if planned is None else planned.line(),
        "kernels_status": status(),
        "peak_rss": peak_rss_bytes(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }


def run_one(job: Job, timeout: float) -> dict[str, Any]:
    """One variant's run in a process of its own (the kernel choice is made at import)."""
    env = dict(os.environ)
    env["EDGE0_NATIVE_KERNELS"] = "1" if job.variant.kernels == "native" else "0"
    if job.variant.threads is not None:
        env["EDGE0_PROMPT_THREADS"] = str(job.variant.threads)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "job.json", Path(tmp) / "result.json"
        src.write_text(json.dumps(attrs.asdict(job)))
        cmd = [sys.executable, "-m", "edge0.bench.prompt", str(src), str(dst)]
        got = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if got.returncode != 0:
            tail = (got.stderr or got.stdout).strip().splitlines()[-3:]
            return {"error": " | ".join(tail) or f"exit {got.returncode}"}
        result: dict[str, Any] = json.loads(dst.read_text())
        return result


def llama_cpp(gguf: Path | None, prompt_len: int, rounds: int) -> dict[str, Any]:
    """llama.cpp's prompt tok/s on `gguf` (one thread), or why there is none."""
    from edge0.bench import llama_peer  # noqa: PLC0415

    why = llama_peer.missing(gguf)
    if why is not None:
        return {"skipped": why}
    assert gguf is not None
    return llama_peer.prompt(gguf, prompt_len, rounds)


def summarise(variants: list[Variant], rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per variant: medians over every round's prompts; per round: the ratios that matter."""
    rows = {}
    for v in variants:
        runs = [r for rd in rounds for r in rd.get(v.name, {}).get("runs", [])]
        if not runs:
            continue
        rows[v.name] = {
            key: statistics.median(r[key] for r in runs)
            for key in ("prompt_tps", "ttft_s", "mib_per_prompt_token", "cpu_s")
        }
        rows[v.name]["tokens"] = runs[0]["tokens"]
        chunks = {rd[v.name].get("chunk") for rd in rounds if v.name in rd}
        rows[v.name]["chunk"] = chunks.pop() if len(chunks) == 1 else sorted(chunks, key=str)
        # each round runs the same prompts in the same order: prompt i's tokens in every round
        per_round = [[r["tokens"] for r in rd[v.name]["runs"]] for rd in rounds if v.name in rd]
        rows[v.name]["same_tokens_every_round"] = all(t == per_round[0] for t in per_round)
    ratios = []
    for a, b in _pairs(variants):
        per = []
        for rd in rounds:
            ra, rb = rd.get(a.name, {}).get("runs"), rd.get(b.name, {}).get("runs")
            if ra and rb:
                per.append(
                    statistics.median(r["prompt_tps"] for r in ra)
                    / statistics.median(r["prompt_tps"] for r in rb)
                )
        if per:
            med = statistics.median(per)
            ratios.append({"variant": a.name, "over": b.name, "per_round": per, "median": med})
    return {"rows": rows, "ratios": ratios}


def _pairs(variants: list[Variant]) -> list[tuple[Variant, Variant]]:
    """Chunked over one-token, native over MLX's, N threads over one: all else the same."""
    names = {v.name for v in variants}
    out = []
    for v in variants:
        for w in (
            attrs.evolve(v, chunk=1) if v.chunk > 1 else None,  # chunked / one-token
            attrs.evolve(v, kernels="mlx") if v.kernels == "native" else None,  # ours / MLX's
            attrs.evolve(v, threads=1) if (v.threads or 1) > 1 else None,  # N threads / 1
        ):
            if w is not None and w.name in names:
                out.append((v, w))
    return out


def table(summary: dict[str, Any], prompt_len: int) -> str:
    lines = [
        f"| variant ({prompt_len}-token prompt) | prompt tok/s | time to first token ms "
        "| MiB read / prompt token | process CPU s / prompt | greedy continuation |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in summary["rows"].items():
        toks = " ".join(map(str, r["tokens"]))
        lines.append(
            f"| {name} | {r['prompt_tps']:.0f} | {r['ttft_s'] * 1e3:.1f} "
            f"| {r['mib_per_prompt_token']:.3f} | {r['cpu_s']:.3f} | {toks} |"
        )
    for q in summary["ratios"]:
        per = ", ".join(f"{x:.2f}" for x in q["per_round"])
        lines.append(
            f"- {q['variant']} / {q['over']}: {q['median']:.2f}x prompt tok/s (rounds: {per})"
        )
    return "\n".join(lines)


def main() -> None:  # the worker: python -m edge0.bench.prompt JOB.json RESULT.json
    raw = json.loads(Path(sys.argv[1]).read_text())
    raw["variant"] = Variant(**raw["variant"])
    result = asyncio.run(_measure(Job(**raw)))
    Path(sys.argv[2]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
