"""Where one decode step goes: its time per part of the model, and its CPU per symbol.

    python tools/bench/step_profile.py MODEL --mode route --top-k 4 --memory-budget 2.2GiB \
        --tiers 'ram>direct' --first-layer wrap --tokens 8 [--perf] [--json OUT]

One engine, one process, one request decoded three ways after a warm-up request:
1. **plain**: the decode steps as they run (`RunStats`: compute and blocked ms/step,
   the step's wall time); with `--perf`, `perf record` samples every thread of the
   process meanwhile and the samples are summed per thread and per kind of code
   (edge0's kernels by op, MLX's op kernels, MLX's own runtime: graph, scheduler,
   allocator; the Python interpreter; libc; the OS kernel).
2. **by part**: the same decode with every part of the model wrapped (`Part` rows
   below: modules such as each quantized linear, the norms, the Gated-DeltaNet's conv
   and recurrence, attention, the MoE block's routing, experts and shared expert).
   A wrapped call first evaluates its array inputs (pending work belongs to its caller),
   then its own outputs, so its wall time is what it costs alone: graph building,
   evaluation and the sync. Each part's *exclusive* wall time per step is printed
   (what it costs minus the wrapped parts inside it), with its calls per step, and the
   step's wall time with the forced syncs beside the plain one, so the perturbation is
   visible (each forced sync costs ~0.1 ms on this CPU).
3. **nodes**: the graph nodes a part builds per call, counted on one call of each part
   (mx.export_to_dot of its outputs, cut at its evaluated inputs).

Only the compute thread is wrapped; the readers and the planner run as they do.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import io
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import mlx.core as mx
from mlx.utils import tree_flatten

COMPUTE = "edge0-compute"


def _arrays(tree: Any) -> list[mx.array]:
    if isinstance(tree, mx.array):
        return [tree]
    if isinstance(tree, (list, tuple, dict)):
        return [v for _, v in tree_flatten(tree) if isinstance(v, mx.array)]
    return []


class Parts:
    """Exclusive wall and thread time per part label, on the compute thread, with evals forced."""

    def __init__(self) -> None:
        self.on = False
        self.ctx: Any = None  # the step clock: only decode steps count
        self.count_nodes = False
        self.wall: collections.Counter[str] = collections.Counter()
        self.cpu: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.nodes: dict[str, int] = {}
        self._stack: list[list[float]] = []

    def reset(self) -> None:
        self.wall.clear()
        self.cpu.clear()
        self.calls.clear()

    def timed(
        self, fn: Callable[..., Any], label: Callable[[Any], str] | str
    ) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kw: Any) -> Any:
            if not self.on or self.ctx.prefill or threading.current_thread().name != COMPUTE:
                return fn(*args, **kw)
            name = label if isinstance(label, str) else label(args[0] if args else None)
            mx.eval(_arrays(list(args)) + _arrays(kw))  # the caller's pending work is the caller's
            t0, c0 = time.perf_counter(), time.thread_time()
            self._stack.append([0.0, 0.0])
            try:
                out = fn(*args, **kw)
                got = _arrays(out)
                if self.count_nodes and name not in self.nodes and got:
                    self.nodes[name] = _nodes(got)
                mx.eval(got)
                return out
            finally:
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                child = self._stack.pop()
                self.wall[name] += wall - child[0]
                self.cpu[name] += cpu - child[1]
                self.calls[name] += 1
                if self._stack:
                    self._stack[-1][0] += wall
                    self._stack[-1][1] += cpu

        return run


def _nodes(outs: list[mx.array]) -> int:
    buf = io.StringIO()
    mx.export_to_dot(buf, *outs)
    # evaluated arrays are drawn as inputs (boxes), not nodes: count the primitives only
    return len(re.findall(r'label ="[A-Za-z0-9_]+', buf.getvalue()))


def _linear_label(path: str) -> str:
    leaf = path.rsplit(".", 1)[-1]
    if ".linear_attn." in f".{path}":
        return "GDN: projections (int4)"
    if ".self_attn." in f".{path}":
        return "attention: projections (int4)"
    if ".shared_expert" in path:
        return "MoE: shared expert (int4)"
    if leaf == "gate" and ".mlp." in f".{path}":
        return "MoE: router projection"
    if "lm_head" in path:
        return "output head (int4)"
    return f"linear: {leaf}"


def _norm_label(path: str) -> str:
    leaf = path.rsplit(".", 1)[-1]
    if leaf in ("q_norm", "k_norm"):
        return "attention: q/k norms"
    return "layer norms"


def install(parts: Parts, model: Any) -> None:
    """Wrap the model's parts (classes and the module-level functions its layers call)."""
    import mlx.nn as nn
    import mlx_lm.models.qwen3_5 as qwen3_5
    import mlx_lm.models.qwen3_next as qwen3_next

    import edge0.families.base as fam
    import edge0.kernels.layers as kl
    import edge0.runtime.layers.block as block
    import edge0.runtime.layers.streams as streams

    paths = {id(m): p for p, m in model.named_modules()}

    def by_path(fmt: Callable[[str], str]) -> Callable[[Any], str]:
        return lambda self: fmt(paths.get(id(self), type(self).__name__))

    def wrap(owner: Any, name: str, label: Callable[[Any], str] | str) -> None:
        if name in vars(owner):
            setattr(owner, name, parts.timed(getattr(owner, name), label))

    wrap(kl.NativeQuantizedLinear, "__call__", by_path(_linear_label))
    wrap(nn.QuantizedLinear, "__call__", by_path(_linear_label))
    wrap(nn.Linear, "__call__", by_path(_linear_label))
    wrap(kl.NativeRMSNorm, "__call__", by_path(_norm_label))
    wrap(nn.RMSNorm, "__call__", by_path(_norm_label))
    wrap(kl.NativeRoPE, "__call__", "attention: rope")
    wrap(nn.QuantizedEmbedding, "__call__", "embedding")
    wrap(nn.Embedding, "__call__", "embedding")
    wrap(nn.Conv1d, "__call__", "GDN: conv1d")
    wrap(qwen3_5.GatedDeltaNet, "__call__", "GDN: other (splits, silu, state)")
    for native_gdn in ("NativeGatedDeltaNet", "NativeQwen3NextGatedDeltaNet"):
        if hasattr(kl, native_gdn):
            wrap(getattr(kl, native_gdn), "__call__", "GDN: other (splits, silu, state)")
    if hasattr(kl, "gated_delta"):  # the native op: conv, gates, recurrence and gated norm
        kl.gated_delta = parts.timed(kl.gated_delta, "GDN: native conv, gates, recurrence, norm")
    wrap(qwen3_next.Qwen3NextRMSNormGated, "__call__", "GDN: gated norm")
    wrap(qwen3_next.Qwen3NextAttention, "__call__", "attention: other (cache, gate)")
    wrap(qwen3_next.Qwen3NextMLP, "__call__", "MoE: shared expert (int4)")
    wrap(qwen3_5.DecoderLayer, "__call__", "layer: residual adds")
    for mod in (qwen3_5, qwen3_next):
        for fn, label in (
            ("gated_delta_update", "GDN: recurrence"),
            ("normalize_qk", "GDN: q/k l2 norms"),
            ("scaled_dot_product_attention", "attention: sdpa"),
        ):
            if hasattr(mod, fn):
                setattr(mod, fn, parts.timed(getattr(mod, fn), label))
    wrap(block.StreamingMoE, "__call__", "MoE: block glue")
    block.expert_ffn = parts.timed(block.expert_ffn, "MoE: routed experts (int4)")
    for owner in _family_classes(fam.Family):
        wrap(owner, "scores", "MoE: routing arithmetic")
        wrap(owner, "select", "MoE: routing arithmetic")
        wrap(owner, "weights", "MoE: routing arithmetic")
        wrap(owner, "combine", "MoE: combine")
        wrap(owner, "extra", "MoE: shared expert glue")
    wrap(streams.LayerStream, "route", "MoE: routing sync, prefetch")
    wrap(streams.RoutedStream, "route", "MoE: routing sync, prefetch")
    wrap(streams.Lookahead, "graph", "prerouter head")
    wrap(streams.LayerStream, "slots", "MoE: waiting for slots")


def _family_classes(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _family_classes(sub)
    return out


def _perf_start(pid: int, out: str) -> subprocess.Popen[bytes] | None:
    try:
        return subprocess.Popen(
            ["perf", "record", "-F", "499", "-p", str(pid), "-o", out, "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return None


_KIND_RULES = (  # (dso part, symbol pattern, kind), first match wins
    ("_native", r"sdpa|attention|Attention", "edge0: sdpa"),
    ("_native", r"rms|rope|RMS|RoPE", "edge0: norms, rope"),
    ("_native", r"Pool|pool|worker", "edge0: thread pool"),
    ("_native", r"", "edge0: int4 kernels"),
    (
        "libmlx",
        r"[Bb]inary|[Uu]nary|[Rr]educ|[Cc]opy|[Ss]oftmax|[Aa]rg[Pp]art|[Gg]ather|[Cc]onv|"
        r"[Mm]atmul|gemm|[Qq]uantiz|[Ss]can|[Ss]ort|[Cc]ompiled|[Cc]oncat|[Ss]lice|[Ss]elect|"
        r"[Ee]xp|[Ss]igmoid|[Ll]og|[Ss]qrt|[Tt]ake|[Ss]catter|simd|Simd|apply|vector",
        "MLX: op kernels",
    ),
    ("libmlx", r"", "MLX: runtime (graph, eval, scheduler, allocator)"),
    ("libpython", r"", "Python interpreter"),
    ("libc", r"mem(cpy|set|move)|__memcpy|__memset", "libc: memcpy, memset"),
    ("libc", r"", "libc: other (malloc, locks)"),
    ("libstdc++", r"", "libstdc++"),
    ("kernel", r"", "OS kernel (syscalls, faults, I/O)"),
    ("numpy", r"", "numpy"),
    ("openblas", r"", "BLAS"),
)


def _kind(dso: str, sym: str) -> str:
    for part, pattern, kind in _KIND_RULES:
        if part in dso and re.search(pattern, sym):
            return kind
    return f"other ({Path(dso).name or '?'})"


def _perf_report(data: str, names: dict[int, str]) -> dict[str, Any]:
    got = subprocess.run(
        ["perf", "script", "-i", data, "-F", "tid,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    kinds: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    per_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    n = 0
    for line in got.splitlines():
        m = re.match(r"\s*(\d+)\s+(.*)$", line)
        if not m:
            continue
        tid, rest = int(m.group(1)), m.group(2)
        d = re.search(r"\(([^)]*)\)\s*$", rest)
        dso = d.group(1) if d else "?"
        sym = rest[: d.start()] if d else rest
        sym = re.sub(r"^[0-9a-f]+\s*", "", sym.strip())
        who = names.get(tid, "native threads (MLX's stream, kernel pool)")
        kind = _kind(dso, sym)
        kinds[kind] += 1
        threads[who] += 1
        per_thread[who][kind] += 1
        n += 1
    return {
        "samples": n,
        "kinds": dict(kinds),
        "threads": dict(threads),
        "per_thread": {k: dict(v) for k, v in per_thread.items()},
    }


async def profile(model: str, opts: dict[str, Any], tokens: int, perf: bool) -> dict[str, Any]:
    from edge0.runtime.engine.api import Engine

    parts = Parts()
    out: dict[str, Any] = {}
    async with Engine.open(model, **opts) as eng:
        ids = list(eng.tokenizer.encode("def fibonacci(n):"))[:4]

        async def decode() -> tuple[Any, list[int], list[float]]:
            got = [t async for t in eng.tokens(ids, max_tokens=tokens, stop=False)]
            stats = eng.last_stats
            walls = [r.wall for r in eng.setup.ctx.records if not r.prefill]
            return stats, got, walls

        await decode()  # warm-up: the page cache, MLX's buffers, first-use work
        names = {
            t.native_id: (t.name if t.name in (COMPUTE, "edge0-planner") else _thread_kind(t))
            for t in threading.enumerate()
            if t.native_id is not None
        }
        proc = None
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "perf.data")
            if perf:
                proc = _perf_start(os.getpid(), data)
                await asyncio.sleep(0.5)
            stats, plain_tokens, walls = await decode()
            if proc is not None:
                proc.send_signal(signal.SIGINT)
                proc.wait()
                out["perf"] = _perf_report(data, names)
        out["plain"] = {
            "decode_tps": stats.decode_tps,
            "compute_ms_per_step": stats.compute_ms_per_step,
            "blocked_ms_per_step": stats.blocked_ms_per_step,
            "bytes_per_token": stats.bytes_per_token,
            "step_wall_ms": [w * 1e3 for w in walls[-stats.decode_steps :]],
        }

        install(parts, eng.setup.model)
        parts.ctx = eng.setup.ctx

        def start() -> None:
            parts.reset()
            parts.on = True

        def stop() -> None:
            parts.on = False

        await eng._compute.run(start)
        stats2, part_tokens, walls2 = await decode()
        await eng._compute.run(stop)
        steps = len(walls2)  # prompt steps are in the sums too: per step of any kind
        out["parts"] = {
            k: {
                "wall_ms_per_step": v / steps * 1e3,
                "cpu_ms_per_step": parts.cpu[k] / steps * 1e3,
                "calls_per_step": parts.calls[k] / steps,
            }
            for k, v in parts.wall.items()
        }
        out["parts_steps"] = steps
        out["parts_step_wall_ms"] = sum(walls2) / steps * 1e3
        out["parts_tokens_equal"] = part_tokens == plain_tokens

        def count() -> None:
            parts.count_nodes = True
            parts.on = True

        await eng._compute.run(count)
        await decode()
        await eng._compute.run(stop)
        out["nodes_per_call"] = parts.nodes
    return out


def _thread_kind(t: threading.Thread) -> str:
    if t.name.startswith("edge0-read"):
        return "readers"
    if t is threading.main_thread():
        return "event loop"
    return f"python: {re.sub(r'[-_]?[0-9]+$', '', t.name)}"


@click.command()
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.option("--mode", default="route", show_default=True)
@click.option("--top-k", type=int, default=None)
@click.option("--memory-budget", default=None)
@click.option("--tiers", default=None)
@click.option("--first-layer", default=None)
@click.option("--tokens", default=8, show_default=True, help="Decode tokens per request.")
@click.option("--perf", is_flag=True, help="Sample the plain steps with `perf record`.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write results here.")
def main(
    model: str,
    mode: str,
    top_k: int | None,
    memory_budget: str | None,
    tiers: str | None,
    first_layer: str | None,
    tokens: int,
    perf: bool,
    json_out: str | None,
) -> None:
    opts: dict[str, Any] = {"mode": mode}
    for key, value in (
        ("top_k", top_k),
        ("memory_budget", memory_budget),
        ("tiers", tiers),
        ("first_layer", first_layer),
    ):
        if value is not None:
            opts[key] = value
    load0 = os.getloadavg()
    got = asyncio.run(profile(model, opts, tokens, perf))
    got.update(model=Path(model).name, options=opts, tokens=tokens)
    got["load"] = [load0, os.getloadavg()]
    _print(got)
    if json_out:
        Path(json_out).write_text(json.dumps(got, indent=1))


def _print(got: dict[str, Any]) -> None:
    plain = got["plain"]
    walls = sorted(plain["step_wall_ms"])
    click.echo(
        f"plain: {plain['decode_tps']:.2f} tok/s, compute {plain['compute_ms_per_step']:.1f} "
        f"ms/step, blocked {plain['blocked_ms_per_step']:.1f} ms/step, step wall median "
        f"{walls[len(walls) // 2]:.1f} ms; load {got['load'][0][0]:.1f} -> {got['load'][1][0]:.1f}"
    )
    total = sum(v["wall_ms_per_step"] for v in got["parts"].values())
    click.echo(
        f"by part (evals forced; step wall {got['parts_step_wall_ms']:.1f} ms, parts "
        f"{total:.1f} ms; tokens {'equal' if got['parts_tokens_equal'] else 'DIFFERENT'})"
    )
    click.echo("| part | wall ms/step | share | thread CPU ms/step | calls/step | nodes/call |")
    click.echo("|---|---|---|---|---|---|")
    for k, v in sorted(got["parts"].items(), key=lambda kv: -kv[1]["wall_ms_per_step"]):
        nodes = got["nodes_per_call"].get(k, "")
        click.echo(
            f"| {k} | {v['wall_ms_per_step']:.1f} | {v['wall_ms_per_step'] / total:.1%} | "
            f"{v['cpu_ms_per_step']:.1f} | {v['calls_per_step']:.0f} | {nodes} |"
        )
    perf = got.get("perf")
    if perf:
        n = perf["samples"]
        click.echo(f"perf: {n} samples (499 Hz, every thread)")
        click.echo("| code | share of the process's CPU |")
        click.echo("|---|---|")
        for k, v in sorted(perf["kinds"].items(), key=lambda kv: -kv[1]):
            click.echo(f"| {k} | {v / n:.1%} |")
        click.echo("| thread | share |")
        click.echo("|---|---|")
        for k, v in sorted(perf["threads"].items(), key=lambda kv: -kv[1]):
            click.echo(f"| {k} | {v / n:.1%} |")


if __name__ == "__main__":
    main()
