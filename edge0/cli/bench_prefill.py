"""`edge0 bench prefill [MODEL]`: prompt tok/s, time to first token, bytes read per prompt token."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click


@click.command(name="prefill")
@click.argument(
    "model", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option("--prompt-len", default=207, show_default=True, type=click.IntRange(2))
@click.option("--prompts", default=2, show_default=True, type=click.IntRange(1), help="Per run.")
@click.option(
    "--tokens", default=8, show_default=True, type=click.IntRange(1), help="Greedy tokens after it."
)
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1))
@click.option(
    "--kernels",
    default="native,mlx",
    show_default=True,
    help="native, mlx (MLX's own ops, EDGE0_NATIVE_KERNELS=0), comma-separated.",
)
@click.option(
    "--chunks",
    default="256,1",
    show_default=True,
    help="Prompt tokens per forward, comma-separated (1: one token per step; plan: the "
    "memory plan's, with --memory-budget).",
)
@click.option("--memory-budget", default=None, metavar="SIZE", help="Every run's budget.")
@click.option("--top-k", type=click.IntRange(1), default=None, help="Every run's --top-k.")
@click.option(
    "--first-layer", default=None, help="Every run's --first-layer [default: the engine's]."
)
@click.option("--predictor", default=None, help="Every run's --predictor [default: the engine's].")
@click.option("--tiers", default="pread", show_default=True, metavar="SPEC")
@click.option("--mode", default=None, help="Engine mode [default: the layout's].")
@click.option(
    "--threads",
    default="",
    help="EDGE0_PROMPT_THREADS values to compare, e.g. 1,2 [default: the engine's].",
)
@click.option(
    "--gguf",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The same model for llama.cpp (needs llama-cpp-python).",
)
@click.option("--timeout", default=1800.0, show_default=True, help="Seconds per run.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False, path_type=Path))
def command(
    model: Path | None,
    prompt_len: int,
    prompts: int,
    tokens: int,
    rounds: int,
    kernels: str,
    chunks: str,
    tiers: str,
    mode: str | None,
    memory_budget: str | None,
    top_k: int | None,
    first_layer: str | None,
    predictor: str | None,
    threads: str,
    gguf: Path | None,
    timeout: float,
    json_out: Path | None,
) -> None:
    """Prompt processing of MODEL (default: the demo model): each (kernels, chunk, threads)
    variant in its own process, rounds interleaved; prompt tok/s, time to first token, MiB read per
    prompt token and the greedy continuation, with ratios per round."""
    from edge0.bench import prompt as bench

    try:
        variants = bench.parse_variants(kernels, chunks, threads)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if any(v.chunk == bench.PLAN for v in variants) and memory_budget is None:
        raise click.BadParameter("--chunks plan needs --memory-budget (the plan chooses it)")
    m = None if model is None else str(model)
    given = {
        "memory_budget": memory_budget,
        "top_k": top_k,
        "first_layer": first_layer,
        "predictor": predictor,
    }
    engine = {k: v for k, v in given.items() if v is not None}
    done = []
    for i in range(rounds):
        got = {}
        for v in variants:
            job = bench.Job(m, v, prompt_len, prompts, tokens, tiers, mode, engine)
            got[v.name] = bench.run_one(job, timeout)
            err = got[v.name].get("error")
            said = f"failed: {err}" if err else "done"
            click.echo(f"round {i + 1} {v.name}: {said}", err=True)
        done.append(got)
    summary = bench.summarise(variants, done)
    peer = bench.llama_cpp(gguf, prompt_len, rounds)
    load = os.getloadavg()
    click.echo(bench.table(summary, prompt_len))
    if "skipped" in peer:
        click.echo(peer["skipped"])
    else:
        click.echo(f"llama.cpp (1 thread, {gguf}): {max(peer['prompt_tps']):.0f} prompt tok/s")
    click.echo(f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end")
    if json_out is not None:
        out = {
            "model": m,
            "engine": engine,
            "prompt_len": prompt_len,
            "rounds": done,
            "summary": summary,
            "llama_cpp": peer,
            "load_average": load,
        }
        json_out.write_text(json.dumps(out, indent=1))
        click.echo(f"wrote {json_out}", err=True)
