"""Route policies against the teacher: the streaming engine decodes held-out text teacher-forced
(docs/benchmarks/route_policy.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edge0.eval.quality import summarize, token_stats
from edge0.log import get_logger

log = get_logger(__name__)
_MIB = 1 << 20


@attrs.frozen
class PolicyVariant:
    """One row: a decode mode (route, or resident as the exact reference) at capacity K."""

    mode: str
    k: int | None  # None: the model's top-k
    policy: str = "predicted"
    deadline_ms: float | None = None

    @property
    def label(self) -> str:
        if self.mode != "route":
            return self.mode
        if self.deadline_ms is not None and math.isinf(self.deadline_ms):
            return "exact (deadline inf)"
        dl = "" if self.deadline_ms is None else f" {self.deadline_ms:g}ms"
        return f"{self.policy}{dl}"


async def forced_decode(
    eng: Any,
    window: list[int],
    prompt_len: int,
    sink: Callable[[np.ndarray], None] | None = None,
) -> tuple[np.ndarray, dict]:
    """On `eng`'s compute thread: prefill `window[:prompt_len]`, then feed every later token
    but the last as a decode step. Returns the (T, V) logits of those steps (predicting
    `window[prompt_len + 1:]`) and the steps' counters; with `sink`, each step's (V,) row
    goes to it instead and none are kept (a large vocabulary's rows add up to hundreds of
    MiB, more than a memory budget leaves)."""
    from edge0.runtime.compute.runner import Runner, greedy
    from edge0.runtime.prefill.chunks import prefill

    setup = eng.setup
    steps, sched = setup.ctx, setup.reads
    logits: list[mx.array] = []

    def record(out: mx.array) -> mx.array:
        logits.append(out)
        return greedy(out)  # fenced with the step, so the logits are evaluated with it

    def job() -> tuple[np.ndarray, dict]:
        runner = Runner(setup.model, steps, -1, greedy)
        prefill(runner, window[:prompt_len], decode=True)
        runner.sampler = record
        bytes0 = sched.stats.bytes if sched is not None else 0
        t0 = time.perf_counter()
        last = len(window) - 2
        rows = []
        for i in range(prompt_len, last + 1):
            runner.feed(window[i], prefill=False, prefetch=i < last)
            row = np.array(logits.pop()[0], dtype=np.float32)
            if sink is None:
                rows.append(row)
            else:
                sink(row)
        wall = time.perf_counter() - t0
        runner.finish()
        decode = [r for r in steps.records if not r.prefill]
        counters = {
            "steps": len(decode),
            "wall_s": wall,
            "wait_s": sum(r.wait for r in decode),
            "bytes": (sched.stats.bytes - bytes0) if sched is not None else 0,
            "recall_hits": sum(r.recall_hits for r in decode),
            "recall_slots": sum(r.recall_slots for r in decode),
        }
        return (np.stack(rows) if rows else np.zeros((0, 0), np.float32)), counters

    out: tuple[np.ndarray, dict] = await eng.run_on_compute(job)
    return out


async def evaluate_policy(
    model_dir: Path,
    variant: PolicyVariant,
    teacher_logits: np.ndarray,
    windows: np.ndarray,
    prompt_len: int,
    tiers: str,
) -> dict[str, Any]:
    """One row: the variant's engine decodes every window teacher-forced; figures vs teacher."""
    from edge0.runtime.engine.api import Engine

    opts: dict[str, Any] = {"mode": variant.mode, "top_k": variant.k, "record_routing": True}
    if variant.mode != "resident":
        opts.update(tiers=tiers, route_policy=variant.policy)
        if variant.deadline_ms is not None:
            opts["route_deadline_ms"] = variant.deadline_ms
    parts: dict[str, list[np.ndarray]] = {}
    total = {
        "steps": 0,
        "wall_s": 0.0,
        "wait_s": 0.0,
        "bytes": 0,
        "recall_hits": 0,
        "recall_slots": 0,
    }
    async with Engine.open(model_dir, **opts) as eng:
        k = eng.setup.ctx.top_k
        await forced_decode(eng, list(map(int, windows[0][: prompt_len + 4])), prompt_len)
        for w, t_logits in zip(windows, teacher_logits, strict=True):
            got, counters = await forced_decode(eng, list(map(int, w)), prompt_len)
            want = t_logits[prompt_len : len(w) - 1]  # (T, V) teacher at the same positions
            tgt = mx.array(np.asarray(w[prompt_len + 1 :]))[None]
            for key, v in token_stats(mx.array(want)[None], mx.array(got)[None], tgt).items():
                parts.setdefault(key, []).append(v)
            for key in total:
                total[key] += counters[key]
    stats = {key: np.concatenate(v) for key, v in parts.items()}
    policy = variant.policy if variant.mode == "route" else "-"
    row: dict[str, Any] = {"variant": variant.label, "mode": variant.mode, "k": k, "policy": policy}
    row.update(summarize(stats, np.array([])))
    n = max(1, total["steps"])
    row["route_recall"] = (
        total["recall_hits"] / total["recall_slots"] if total["recall_slots"] else None
    )
    row["decode_tps"] = total["steps"] / total["wall_s"] if total["wall_s"] else 0.0
    row["blocked_ms_per_step"] = total["wait_s"] / n * 1e3
    row["bytes_per_token"] = total["bytes"] / n
    log.info("quality.policy", **{k_: v for k_, v in row.items() if not k_.startswith("first")})
    return row


def teacher_logits(teacher: nn.Module, windows: np.ndarray, batch: int = 4) -> np.ndarray:
    """(N, S, V) teacher logits of (N, S) windows (position i predicts token i + 1)."""
    out = []
    for i in range(0, len(windows), batch):
        logits = teacher(mx.array(windows[i : i + batch]))
        out.append(np.array(logits.astype(mx.float32)))
    return np.concatenate(out)


def variants_for(
    policies: list[str], ks: list[int], deadline_ms: float | None
) -> list[PolicyVariant]:
    """The resident reference (the model's top-k), then per K the exact routing (deadline
    inf: the floor any policy can reach at that K) and every policy."""
    out = [PolicyVariant("resident", None)]
    for k in ks:
        out.append(PolicyVariant("route", k, "available-first", math.inf))
        for p in policies:
            out.append(PolicyVariant("route", k, p, deadline_ms if p != "predicted" else None))
    return out


def markdown(rows: list[dict[str, Any]], tiers: str) -> str:
    """The side-by-side table of docs/benchmarks/route_policy.md."""
    lines = [
        f"Tier stack `{tiers}`; decode steps teacher-forced (tok/s of those steps, "
        "record_routing on: one host sync per layer for every row).",
        "",
        "| K | policy | ppl ratio | KL mean | KL p99 | top-1 agree | true top-K recall | "
        "decode tok/s | blocked ms/step | MiB/token |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        recall = "-" if r["route_recall"] is None else f"{r['route_recall']:.3f}"
        lines.append(
            f"| {r['k']} | {r['variant']} | {r['ppl_ratio']:.4f} | {r['kl_mean']:.4f} | "
            f"{r['kl_p99']:.4f} | {r['top1_agree']:.4f} | {recall} | {r['decode_tps']:.1f} | "
            f"{r['blocked_ms_per_step']:.2f} | {r['bytes_per_token'] / _MIB:.3f} |"
        )
    return "\n".join(lines) + "\n"
