"""The Gated-DeltaNet node of 30 layers of the 35B shape (one decode token each), its states
dropped from the caches before each step as decode meets them, with the row unit this run
uses: run it with EDGE0_KERNEL_ISA=portable (the scalar rows) and =avx512 or =avx2 (eight
rows a pass), alternating, and compare the medians.

    EDGE0_KERNEL_ISA=portable python docs/benchmarks/scripts/gated_delta_rows.py
    EDGE0_KERNEL_ISA=avx512 python docs/benchmarks/scripts/gated_delta_rows.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from edge0.kernels import native

B, T, HK, DK, HV, DV, K = 1, 1, 16, 128, 32, 128, 4  # the 35B shape's linear attention
C = 2 * HK * DK + HV * DV


def layer() -> dict[str, mx.array]:
    r = mx.random.normal
    return {
        "qkv": r((B, T, C)),
        "z": r((B, T, HV, DV)),
        "b": r((B, T, HV)),
        "a": r((B, T, HV)),
        "cs": r((B, K - 1, C)),
        "cw": r((C, K, 1)) * 0.3,
        "st": r((B, HV, DV, DK)) * 0.1,
        "A": r((HV,)) * 0.1,
        "dt": r((HV,)) * 0.1,
        "nw": r((DV,)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    mod = native.module()
    if mod is None or not hasattr(mod, "evict"):
        raise SystemExit(f"needs the native kernels with evict: {native.status()}")
    layers = [layer() for _ in range(args.layers)]
    mx.eval(layers)
    inv = DK**-0.5

    def step() -> None:
        ys = []
        for p in layers:
            y, cs, st = mod.gated_delta(
                p["qkv"], p["z"], p["b"], p["a"], p["cs"], p["cw"], p["st"], p["A"], p["dt"],
                p["nw"], HK, DK, HV, DV, inv * inv, inv, 1e-6 * inv * inv, 1e-6,
            )  # fmt: skip
            ys.append(y)
            p["st"], p["cs"] = st, cs  # the caches carried, as a decode step does
        mx.eval(ys, [p["st"] for p in layers])

    step()
    ms = []
    for _ in range(args.steps):
        mod.evict([p["st"] for p in layers])  # the states come from memory, as in decode
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    print(
        f"unit {mod.isa()}: {args.layers} layers, median {statistics.median(ms):.2f} ms "
        f"(min {min(ms):.2f}) over {args.steps} steps"
    )


if __name__ == "__main__":
    main()
