"""Where the bytes are while an engine decodes: RSS and MLX memory per phase and per step.

    python tools/memprobe.py MODEL --mode route --top-k 4 --first-layer wrap --tiers direct \
        --tokens 4 [--memory-budget 3GiB] [--json out.json]

Phases: `start` (interpreter and libraries), `opened` (model loaded, slot pool and
tier stack built), then one row per generated token (MLX active memory, the step's
MLX peak, MLX's buffer cache, RSS, peak RSS so far). The last lines split the
peak RSS into the parts the memory plan counts (docs/memory.md): resident
weights, predictor heads, slot pool, KV cache and recurrent state (measured from
the request's cache objects), the process baseline, and what is left: the decode
working memory. Run it under tools/memcap.py to see page cache too.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_MIB = 1 << 20


def snapshot(tag: str) -> dict[str, Any]:
    import mlx.core as mx

    from edge0.stats import current_rss_bytes, peak_rss_bytes

    return {
        "phase": tag,
        "rss": current_rss_bytes(),
        "peak_rss": peak_rss_bytes(),
        "mlx_active": int(mx.get_active_memory()),
        "mlx_peak": max(int(mx.get_peak_memory()), int(mx.get_active_memory())),
        "mlx_cache": int(mx.get_cache_memory()),
    }


def _nbytes(tree: Any) -> int:
    from mlx.utils import tree_flatten

    return sum(int(v.nbytes) for _, v in tree_flatten(tree) if hasattr(v, "nbytes"))


def parts(eng: Any, cache: list[Any]) -> dict[str, int]:
    """The plan's parts as they are in memory after a request."""
    setup = eng.setup
    heads = getattr(getattr(setup.ctx, "predictor", None), "heads", None)
    head_bytes = _nbytes([h.parameters() for h in heads.heads.values()]) if heads else 0
    experts = getattr(setup.ctx, "resident_experts", {}) or {}
    return {
        "resident": _nbytes(setup.model.parameters()),
        "resident_experts": _nbytes(experts),
        "heads": head_bytes,
        "slots": setup.scheduler.memory.nbytes if setup.scheduler is not None else 0,
        "kv_and_state": sum(_nbytes(c.state) for c in cache),
    }


async def probe(path: str, tokens: int, opts: dict[str, Any]) -> dict[str, Any]:
    import mlx.core as mx

    from edge0.runtime.compute.runner import Runner
    from edge0.runtime.engine.api import Engine

    rows = [snapshot("start")]
    baseline = rows[0]["rss"]
    caches: list[Any] = []
    real_init = Runner.__init__

    def keep_cache(self: Any, *a: Any, **kw: Any) -> None:  # the request's KV/state objects
        real_init(self, *a, **kw)
        caches[:] = list(self.cache)

    Runner.__init__ = keep_cache  # type: ignore[method-assign]
    async with Engine.open(path, **opts) as eng:
        rows.append(snapshot("opened"))
        plan = eng.setup.memory_plan
        await eng._compute.run(mx.reset_peak_memory)
        n = 0
        async for _tok in eng.tokens([1, 2, 3, 4], max_tokens=tokens, stop=False):
            rows.append(snapshot(f"token {n}"))
            n += 1
            await eng._compute.run(mx.reset_peak_memory)
        stats = eng.last_stats
        measured = parts(eng, caches)
    peak = max(r["peak_rss"] for r in rows)
    counted = sum(measured.values()) + baseline
    return {
        "rows": rows,
        "parts": measured,
        "baseline": baseline,
        "peak_rss": peak,
        "working": peak - counted,
        "plan": plan.line() if plan is not None else None,
        "decode_tps": stats.decode_tps if stats is not None else None,
    }


@click.command()
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.option("--mode", default="route")
@click.option("--top-k", type=int, default=None)
@click.option("--first-layer", default="wrap")
@click.option("--predictor", default=None)
@click.option("--tiers", default="direct")
@click.option("--memory-budget", default=None)
@click.option("--tokens", default=4, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def main(
    model: str,
    mode: str,
    top_k: int | None,
    first_layer: str,
    predictor: str | None,
    tiers: str,
    memory_budget: str | None,
    tokens: int,
    json_out: str | None,
) -> None:
    """Decode a few tokens of MODEL and print where the memory is."""
    opts = {
        "mode": mode,
        "top_k": top_k,
        "first_layer": first_layer,
        "predictor": predictor,
        "tiers": tiers,
        "memory_budget": memory_budget,
    }
    out = asyncio.run(probe(model, tokens, opts))
    click.echo(
        f"{'phase':<10} {'RSS':>7} {'peak RSS':>9} {'MLX active':>11} {'MLX peak':>9} "
        f"{'MLX cache':>10}   (MiB)"
    )
    for r in out["rows"]:
        click.echo(
            f"{r['phase']:<10} {r['rss'] / _MIB:7.0f} {r['peak_rss'] / _MIB:9.0f} "
            f"{r['mlx_active'] / _MIB:11.0f} {r['mlx_peak'] / _MIB:9.0f} "
            f"{r['mlx_cache'] / _MIB:10.0f}"
        )
    click.echo(
        "parts (MiB): "
        + ", ".join(f"{k} {v / _MIB:.1f}" for k, v in out["parts"].items())
        + f", process baseline {out['baseline'] / _MIB:.1f}"
    )
    click.echo(
        f"peak RSS {out['peak_rss'] / _MIB:.1f} MiB = parts + working "
        f"{out['working'] / _MIB:.1f} MiB; decode {out['decode_tps'] or 0:.2f} tok/s"
    )
    if out["plan"]:
        click.echo(out["plan"])
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
