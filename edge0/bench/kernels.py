"""`edge0 bench kernels`: GB/s of quantized weights read by the native kernels and by MLX's ops
(docs/benchmarks/kernels.md, "Kernel by kernel": how it measures).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.activations import SwigluOAI
from mlx_lm.models.switch_layers import SwiGLU

from edge0.kernels import native, ops

# shape -> (d_model, expert ff, top-k, expert quantization, [(name, rows, cols) of linears])
SHAPES: dict[str, tuple[int, int, int, tuple[str, int, int], list[tuple[str, int, int]]]] = {
    "demo": (256, 128, 4, ("affine", 4, 64), [("q_proj", 256, 256), ("o_proj", 256, 256)]),
    "medium": (1024, 512, 8, ("affine", 4, 64), [("q_proj", 2048, 1024), ("o_proj", 1024, 1024)]),
    "35b": (
        2048,
        512,
        8,
        ("affine", 4, 64),
        [("q_proj", 8192, 2048), ("o_proj", 2048, 4096), ("shared up", 512, 2048)],
    ),
    "gpt-oss-20b": (2880, 2880, 4, ("mxfp4", 4, 32), [("q_proj", 4096, 2880)]),
}


def memory_bandwidth(mib: int = 512, rounds: int = 3) -> dict[str, float]:
    """GB/s of a triad a = b + s*c (3 arrays of `mib` MiB; 4 passes) and of a read-only sum."""
    n = mib * 2**20 // 4
    a, b, c = (np.ones(n, dtype=np.float32) for _ in range(3))
    triad, read = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        np.multiply(c, np.float32(3.0), out=a)  # read c, write a
        np.add(a, b, out=a)  # read a, b, write a
        triad.append(4 * a.nbytes / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        float(b.sum())
        read.append(b.nbytes / (time.perf_counter() - t) / 1e9)
    return {"triad_gbs": max(triad), "read_gbs": max(read)}


def _copies(make: Callable[[], Any], one_bytes: int, footprint: int) -> list[Any]:
    n = max(2, -(-footprint // max(one_bytes, 1)))
    out = [make() for _ in range(n)]
    mx.eval(out)
    return out


def _nbytes(arrs: Any) -> int:
    return sum(a.nbytes for a in arrs if isinstance(a, mx.array))


def _time(build: Callable[[], list[mx.array]]) -> tuple[float, float]:
    """(wall s, process CPU s) of evaluating what `build` returns."""
    graph = build()
    t, c = time.perf_counter(), time.process_time()
    mx.eval(graph)
    return time.perf_counter() - t, time.process_time() - c


def _linear_case(rows: int, cols: int, m: int, footprint: int) -> dict[str, Callable[[], Any]]:
    def make() -> tuple[mx.array, ...]:
        return tuple(mx.quantize(mx.random.normal((rows, cols)), group_size=64, bits=4))

    mats = _copies(make, rows * cols // 2, footprint)
    x = mx.random.normal((m, cols))
    mx.eval(x)
    return {
        "bytes": lambda: sum(_nbytes(w) for w in mats),
        "native": lambda: [ops.qmm(x, w, s, b, 64, 4) for w, s, b in mats],
        "mlx": lambda: [
            mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)
            for w, s, b in mats
        ],
    }


def _ffn_case(
    d: int, ff: int, k: int, quant: tuple[str, int, int], m: int, footprint: int
) -> dict[str, Callable[[], Any]]:
    mode, bits, group = quant
    oai = mode == "mxfp4"  # gpt-oss: biased projections, the clamped SwiGLU
    act = SwigluOAI() if oai else SwiGLU()
    slots = max(2 * k, -(-footprint // (3 * d * ff * bits // 8)))

    def stack(rows: int, cols: int) -> ops.Proj:
        q = mx.quantize(
            mx.random.normal((slots, rows, cols)) * 0.05, group_size=group, bits=bits, mode=mode
        )
        bias = mx.zeros((slots, rows)) if oai else None
        return (q[0], q[1], q[2] if mode == "affine" else None, bias, group, bits, mode)

    up, gate, down = stack(ff, d), stack(ff, d), stack(d, ff)
    mx.eval([a for p in (up, gate, down) for a in p[:4] if a is not None])
    calls = slots // k  # every slot visited once per round: weights from DRAM
    perm = np.random.default_rng(0).permutation(slots)
    idxs = [
        mx.array(perm[i * k : (i + 1) * k].reshape(1, 1, k).repeat(m, 0).astype(np.uint32))
        for i in range(calls)
    ]
    # m rows each with its own k experts where the pool allows, else sharing them
    h = mx.random.normal((m, 1, 1, 1, d))
    per_slot = sum(_nbytes(p[:4]) for p in (up, gate, down)) // slots

    def mlx_ffn(idx: mx.array) -> mx.array:
        def proj(p: ops.Proj, inp: mx.array) -> mx.array:
            w, s, b, bias, g, nb, md = p
            y = mx.gather_qmm(
                inp, w, s, b, rhs_indices=idx, transpose=True, group_size=g, bits=nb, mode=md
            )
            return y if bias is None else y + mx.expand_dims(bias[idx], -2)

        return proj(down, act(proj(up, h), proj(gate, h)))

    def native_ffn(idx: mx.array) -> mx.array:
        out = ops.expert_ffn(h, idx, up, gate, down, act)
        assert out is not None, "the native kernels cannot run this FFN"
        return out

    return {
        "bytes": lambda: calls * k * per_slot,
        "native": lambda: [native_ffn(i) for i in idxs],
        "mlx": lambda: [mlx_ffn(i) for i in idxs],
    }


def run_bench(
    shapes: list[str],
    rows: list[int],
    rounds: int,
    threads: list[int],
    footprint_mib: int = 96,
    progress: Callable[[dict[str, Any]], None] | None = None,
    int8: bool = False,
) -> dict[str, Any]:
    """Every case of `shapes` at `rows` (M), native at each thread count and MLX, interleaved
    (with `int8`, also the opt-in int8-activation path on one thread, and its error)."""
    mod = native.module()
    if mod is None:
        raise RuntimeError(f"no native kernels to measure: {native.status()}")
    if int8 and not mod.has_int8_inputs():
        raise RuntimeError(f"the {mod.isa()} row kernel has no int8-activation path to measure")
    footprint = footprint_mib * 2**20
    result: dict[str, Any] = {
        "status": native.status(),
        "isa": mod.isa(),
        "rounds": rounds,
        "footprint_mib": footprint_mib,
        "cases": [],
        "load_before": os.getloadavg(),
    }
    result["memory"] = memory_bandwidth()
    mx.random.seed(0)
    for shape in shapes:
        d, ff, k, quant, linears = SHAPES[shape]
        for m in rows:
            cases = [(f"expert ffn K={k}", _ffn_case(d, ff, k, quant, m, footprint))]
            cases += [(f"{n} {r}x{c}", _linear_case(r, c, m, footprint)) for n, r, c in linears]
            for name, case in cases:
                rec = _measure(mod, case, rounds, threads, int8)
                rec.update(shape=shape, kernel=name, m=m)
                result["cases"].append(rec)
                if progress is not None:
                    progress(rec)
    result["load_after"] = os.getloadavg()
    return result


INT8 = "native int8 1t"


def _int8_error(mod: Any, case: dict[str, Callable[[], Any]]) -> float:
    """max |int8 - float32| / max |float32| over the case's native outputs."""
    outs = {}
    for on in (False, True):
        mod.set_int8_inputs(on)
        got = case["native"]()
        mx.eval(got)
        outs[on] = np.concatenate([np.array(a).reshape(-1) for a in got])
    mod.set_int8_inputs(False)
    return float(np.abs(outs[True] - outs[False]).max() / np.abs(outs[False]).max())


def _measure(
    mod: Any,
    case: dict[str, Callable[[], Any]],
    rounds: int,
    threads: list[int],
    int8: bool = False,
) -> dict[str, Any]:
    nbytes = case["bytes"]()
    variants = [f"native {t}t" for t in threads] + ([INT8] if int8 else []) + ["mlx"]
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    first, first_int8 = mod.threads(), mod.int8_inputs()
    rec: dict[str, Any] = {"bytes": nbytes}
    try:
        mod.set_int8_inputs(False)
        if int8:
            rec["int8_rel_err"] = _int8_error(mod, case)
        _time(case["native"])  # warm-up: page in, first-call costs
        _time(case["mlx"])
        for _ in range(rounds):
            for v in variants:
                if v != "mlx":
                    mod.set_int8_inputs(v == INT8)
                    mod.set_threads(1 if v == INT8 else int(v.split()[1][:-1]))
                w, c = _time(case["mlx" if v == "mlx" else "native"])
                wall[v].append(nbytes / w / 1e9)
                cpu[v].append(nbytes / c / 1e9 if c > 0 else float("nan"))
    finally:
        mod.set_threads(first)
        mod.set_int8_inputs(first_int8)
    # native / MLX within each round: both saw the same moment's load
    base = "native 1t" if "native 1t" in wall else variants[0]
    per_round = [n / m for n, m in zip(wall[base], wall["mlx"], strict=True)]
    rec["ratio_rounds"] = per_round
    rec["ratio_median"] = statistics.median(per_round)
    if int8:
        rec["int8_ratio_rounds"] = [n / m for n, m in zip(wall[INT8], wall["mlx"], strict=True)]
        rec["int8_ratio_median"] = statistics.median(rec["int8_ratio_rounds"])
    for v in variants:
        rec[v] = {
            "gbs": statistics.median(wall[v]),
            "gbs_per_cpu_s": statistics.median(cpu[v]),
            "rounds": wall[v],
        }
    return rec


def markdown(result: dict[str, Any]) -> str:
    """The result as a markdown table (GB/s of weights, wall and per CPU-second)."""
    mem = result["memory"]
    first = result["cases"][0]
    variants = [k for k in first if k.startswith("native")] + ["mlx"]
    int8 = "int8_ratio_median" in first
    head = [
        "shape",
        "kernel",
        "M",
        *(f"{v} GB/s" for v in variants),
        "native 1t / mlx (median of per-round ratios)",
    ]
    if int8:
        head += ["int8 / mlx", "int8 max rel. error"]
    lines = [
        f"memory: triad {mem['triad_gbs']:.1f} GB/s, read {mem['read_gbs']:.1f} GB/s "
        f"(one thread); {result['status']}; load {result['load_before'][0]:.1f} -> "
        f"{result['load_after'][0]:.1f}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for c in result["cases"]:
        cells = [c["shape"], c["kernel"], str(c["m"])]
        cells += [f"{c[v]['gbs']:.2f} ({c[v]['gbs_per_cpu_s']:.2f}/cpu-s)" for v in variants]
        lo, hi = min(c["ratio_rounds"]), max(c["ratio_rounds"])
        cells.append(f"{c['ratio_median']:.1f}x ({lo:.1f}-{hi:.1f})")
        if int8:
            lo, hi = min(c["int8_ratio_rounds"]), max(c["int8_ratio_rounds"])
            cells += [
                f"{c['int8_ratio_median']:.1f}x ({lo:.1f}-{hi:.1f})",
                f"{c['int8_rel_err']:.1e}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
