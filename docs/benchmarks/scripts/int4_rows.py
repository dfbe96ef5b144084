"""Cost of MLX's CPU int4 kernels against dequantize + one fp32 matmul, by input rows.

Prints, for a resident-sized projection (`--out` x `--in`, int4 g64, bf16 scales
as converted checkpoints keep them), `quantized_matmul` and dequantize+matmul
times at each row count, and for a group of `--group` experts (3 projections of
`--ff` x `--in` each) `gather_qmm` with sorted indices against per-expert
dequantize+matmul at each rows-per-expert count. Best of 3 after a warm-up.
docs/benchmarks/prefill.md ("Why the earlier runs never finished").

Usage: LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \\
       .venv/bin/python docs/benchmarks/scripts/int4_rows.py [--rows 1,16,64,256,512]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import mlx.core as mx


def best_ms(fn: Callable[..., mx.array], *args: mx.array, repeats: int = 3) -> float:
    mx.eval(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def projection(out: int, inp: int, rows: list[int]) -> None:
    wq, s, b = mx.quantize(mx.random.normal((out, inp)) * 0.02, group_size=64, bits=4)
    s, b = s.astype(mx.bfloat16), b.astype(mx.bfloat16)
    mx.eval(wq, s, b)

    def int4(x: mx.array) -> mx.array:
        return mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)

    def dense(x: mx.array) -> mx.array:
        w = mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=64, bits=4)
        return x @ w.T

    for t in rows:
        x = mx.random.normal((t, inp))
        q, d = best_ms(int4, x), best_ms(dense, x)
        diff = mx.abs(dense(x) - int4(x)).max()
        print(
            f"{out}x{inp} int4, {t} rows: quantized_matmul {q:.1f} ms, dequantize+matmul "
            f"{d:.1f} ms, max |diff| {diff.item():.1e}",
            flush=True,
        )


def experts(group: int, ff: int, inp: int, rows: list[int]) -> None:
    shapes = [(group, ff, inp), (group, ff, inp), (group, inp, ff)]
    ws = [mx.quantize(mx.random.normal(sh) * 0.02, group_size=64, bits=4) for sh in shapes]
    mx.eval(ws)

    def act(u: mx.array, g: mx.array) -> mx.array:
        return u * g * mx.sigmoid(g)

    def gathered(h: mx.array, idx: mx.array) -> mx.array:
        up, gate = (
            mx.gather_qmm(
                h, *w, rhs_indices=idx, transpose=True, group_size=64, bits=4, sorted_indices=True
            )
            for w in ws[:2]
        )
        return mx.gather_qmm(
            act(up, gate),
            *ws[2],
            rhs_indices=idx,
            transpose=True,
            group_size=64,
            bits=4,
            sorted_indices=True,
        )

    def dense(h: mx.array, idx: mx.array) -> mx.array:
        r = h.shape[0] // group
        outs = []
        for e in range(group):
            x = h[e * r : (e + 1) * r, 0]
            up, gate, down = (
                mx.dequantize(w[e], s[e], b[e], group_size=64, bits=4) for w, s, b in ws
            )
            outs.append(act(x @ up.T, x @ gate.T) @ down.T)
        return mx.concatenate(outs)

    for r in rows:
        h = mx.random.normal((r * group, 1, inp))
        idx = mx.array([i // r for i in range(r * group)], dtype=mx.uint32)
        print(
            f"{group} experts 3x{ff}x{inp} int4, {r} rows each: gather_qmm "
            f"{best_ms(gathered, h, idx):.1f} ms, dequantized {best_ms(dense, h, idx):.1f} ms",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64,256,512")
    ap.add_argument("--expert-rows", default="1,2,4,8,16")
    ap.add_argument("--out", type=int, default=8192)
    ap.add_argument("--in", dest="inp", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--group", type=int, default=6)
    a = ap.parse_args()
    projection(a.out, a.inp, [int(r) for r in a.rows.split(",")])
    experts(a.group, a.ff, a.inp, [int(r) for r in a.expert_rows.split(",")])


if __name__ == "__main__":
    main()
