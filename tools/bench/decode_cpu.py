"""CPU per decoded token with the native kernels and with MLX's own ops, in one process.

    python tools/bench/decode_cpu.py MODEL [--windows 30] [--tokens 20] [--json OUT]

Loads an edge0-layout MODEL resident once and greedily decodes windows of `--tokens`
tokens, switching between the native kernels and MLX's own ops (as
`EDGE0_NATIVE_KERNELS=0`) every window, so both paths see the same load. Reports for each
the process CPU time per token (all threads: the graph is built on this one and run on
MLX's stream thread) as the minimum and median over its windows, the per-pair ratio's
median, the graph nodes per token, the load average, and whether every window of both
paths decoded the same tokens. On a shared machine the minimum
is the figure closest to a quiet machine's; wall time is not used.
"""

from __future__ import annotations

import io
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import click
import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edge0.kernels import native  # noqa: E402
from edge0.layout.load import load_layout  # noqa: E402


def _set_native(on: bool) -> None:
    if on:
        os.environ.pop("EDGE0_NATIVE_KERNELS", None)
    else:
        os.environ["EDGE0_NATIVE_KERNELS"] = "0"
    native.reset()


def _nodes(model: object, cache: list[object]) -> int:
    logits = model(mx.array([[3]]), cache=cache)  # type: ignore[operator]
    buf = io.StringIO()
    mx.export_to_dot(buf, logits)
    return len(re.findall(r'label ="[A-Za-z0-9_]+', buf.getvalue()))


@click.command()
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.option("--windows", default=30, show_default=True, help="Windows per path.")
@click.option("--tokens", default=20, show_default=True, help="Tokens per window.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write results here.")
def main(model: str, windows: int, tokens: int, json_out: str | None) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    loaded = load_layout(model)
    m = loaded.model
    load0 = os.getloadavg()
    cpu: dict[str, list[float]] = {"native": [], "mlx": []}
    nodes: dict[str, int] = {}
    tokens_of: dict[str, list[list[int]]] = {"native": [], "mlx": []}
    for w in range(2 * windows):
        name = ("native", "mlx")[w % 2]
        _set_native(name == "native")
        prompt = mx.array([[5, 6, 7, 8, 9, 10, 11, 12]])
        if name not in nodes:  # on a cache of its own: the timed windows all start alike
            counted = make_prompt_cache(m)
            mx.eval(m(prompt, cache=counted))
            nodes[name] = _nodes(m, counted)
        cache = make_prompt_cache(m)
        mx.eval(m(prompt, cache=cache))
        tok = mx.array([[3]])
        got = []
        c0 = time.process_time()
        for _ in range(tokens):
            logits = m(tok, cache=cache)
            tok = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
            mx.eval(tok)
            got.append(tok)
        cpu[name].append((time.process_time() - c0) / tokens * 1e3)
        tokens_of[name].append([int(t.item()) for t in got])
    _set_native(True)
    ratios = [b / a for a, b in zip(cpu["native"], cpu["mlx"], strict=True)]
    lo = {k: min(v) for k, v in cpu.items()}
    mid = {k: statistics.median(v) for k, v in cpu.items()}
    out = {
        "model": Path(model).name,
        "windows": windows,
        "tokens": tokens,
        "load_start": load0,
        "load_end": os.getloadavg(),
        "nodes_per_token": nodes,
        "cpu_ms_per_token": cpu,
        "min": lo,
        "median": mid,
        "pair_ratio_median": statistics.median(ratios),
        "min_ratio": min(cpu["mlx"]) / min(cpu["native"]),
        "window_tokens": tokens_of,
        # every window decodes the same prompt greedily: both paths must give one sequence
        "tokens_equal": all(t == tokens_of["native"][0] for v in tokens_of.values() for t in v),
    }
    click.echo(
        f"graph nodes per token: native {nodes['native']}, MLX {nodes['mlx']}\n"
        f"CPU ms/token, min / median: native {lo['native']:.2f} / {mid['native']:.2f}, "
        f"MLX {lo['mlx']:.2f} / {mid['mlx']:.2f}\n"
        f"MLX / native: {out['min_ratio']:.2f}x (minimums), {out['pair_ratio_median']:.2f}x "
        f"(median of per-pair ratios); load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}\n"
        f"tokens: {'equal on both paths' if out['tokens_equal'] else 'DIFFERENT between the paths'}"
    )
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
