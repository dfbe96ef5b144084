"""`edge0 bench budget`: decode tok/s at each memory budget, each run in a memory cgroup of that
size (edge0.bench.budget)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from edge0.cli.bench_run import llama_options, llama_peer
from edge0.errors import ConfigError


@click.command(name="budget")
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--budgets",
    required=True,
    help="Memory budgets, comma-separated (e.g. 2.2GiB,3GiB,6GiB,12GiB): each is the run's "
    "--memory-budget and the limit of the cgroup it runs in, page cache counted.",
)
@click.option("--mode", default="route", show_default=True, help="Decode mode of every run.")
@click.option(
    "--top-k", type=int, default=None, help="Routed experts per token (default: the model's)."
)
@click.option("--tiers", default=None, help="Tier stack of every run (default: the engine's).")
@click.option(
    "--first-layer", default=None, help="First MoE layer's policy (default: the engine's)."
)
@click.option("--tokens", default=16, show_default=True, help="Decode tokens per prompt.")
@click.option("--prompts", default=2, show_default=True, help="Prompts per run.")
@click.option("--repeats", default=1, show_default=True, help="Runs per budget.")
@llama_options(
    "in each budget's cgroup after Edge0, greedy, the same tokens and prompts, its weights "
    "left in the file mapping (no load-time repacking, which copies them out of it)"
)
@click.option(
    "--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), help="Write the rows."
)
@click.option(
    "--plot",
    "plot_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="PNG: tok/s by budget.",
)
def command(
    model: str,
    budgets: str,
    mode: str,
    top_k: int | None,
    tiers: str | None,
    first_layer: str | None,
    tokens: int,
    prompts: int,
    repeats: int,
    gguf: Path | None,
    llama_threads: int,
    json_out: Path | None,
    plot_out: Path | None,
) -> None:
    """Decode speed at each memory budget, each run inside a real memory cgroup of that size.

    Needs root and a cgroup v1 memory hierarchy or a v2 one with the memory controller;
    without them it says so in one line and runs nothing.
    """
    from edge0.bench import budget as bench_budget

    sizes = bench_budget.parse_budgets(budgets)
    try:
        bench_budget.check_cgroups()
    except (bench_budget.CapError, OSError) as exc:
        raise ConfigError(f"edge0 bench budget needs a memory cgroup: {exc}") from None
    run_args = ["--mode", mode, "--tokens", str(tokens), "--prompts", str(prompts)]
    run_args += ["--repeats", str(repeats)]
    if top_k is not None:
        run_args += ["--top-k", str(top_k)]
    if tiers is not None:
        run_args += ["--tiers", tiers]
    if first_layer is not None:
        run_args += ["--first-layer", first_layer]
    # llama.cpp's default repacking copies the weights into anonymous memory at load, so a
    # cap below the model's size OOM-kills it; without it they stay reclaimable page cache
    peer = llama_peer(gguf, llama_threads, repack=False)
    rows = bench_budget.sweep(model, sizes, run_args, peer=peer, tokens=tokens, prompts=prompts)
    load = os.getloadavg()[0]
    n = f"{len(sizes)} budget{'s' if len(sizes) != 1 else ''}"
    click.echo(f"{model}: {mode}, {n}; load average {load:.1f} at the end")
    click.echo(bench_budget.table(rows))
    for r in rows:
        for err in r["errors"]:
            click.echo(f"{r['budget_bytes'] / 2**30:.2f} GiB: {err}", err=True)
    if json_out is not None:
        out = {"model": model, "mode": mode, "run_args": run_args, "load": load, "rows": rows}
        if peer is not None:
            out["llama_cpp"] = {"gguf": str(gguf), "threads": llama_threads, "repack": False}
        json_out.write_text(json.dumps(out, indent=1))
        click.echo(f"wrote {json_out}", err=True)
    if plot_out is not None:
        from edge0.bench.plot import budget_plot

        budget_plot(rows, plot_out, f"{Path(model).name}, {mode}")
        click.echo(f"wrote {plot_out}", err=True)
