"""The runtime's own cost, interleaved: compute-thread CPU per layer, host syncs, loop lag, waste.

Each variant runs in its own process (a fresh Engine, one warm-up request, then
the measured requests), variants interleaved round by round (A B C A B C ...).
A variant is `TREE:MODE[@G]`: TREE names a checkout given with `--tree
NAME=PATH` (default `now` = this checkout), so an older checkout can run side by
side with this one; `@G` sets `sync_every` (route; checkouts that have it).

    .venv/bin/python tools/bench/runtime_cost.py MODEL --tree before=BEFORE \\
        --variants before:resident,before:route,now:resident,now:route --rounds 3
    .venv/bin/python tools/bench/runtime_cost.py MODEL --variants now:route --clients 4
    .venv/bin/python tools/bench/runtime_cost.py MODEL --tree before=BEFORE \\
        --variants before:hint,now:hint --ratio now:hint/before:hint --tiers SPEC

`--gguf FILE` adds llama.cpp on the same model, once a round after the variants (one thread,
edge0.bench.llama_peer, under `--llama-python`: a Python with llama-cpp-python).

Prints one row per variant (medians over every measured request; `loop CPU
ms/token` is the event-loop thread's CPU time over a run's measured requests
per token generated, a figure the machine's load inflates less than lag) and, per tree,
the per-round route / resident ratio of compute-thread CPU per layer; each `--ratio
A/B`, per round, A's decode tok/s and blocked ms/step over B's; with `--json` also
every request's stats and tokens.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

PROMPTS = (
    "def fibonacci(n):",
    "The river carried small boats of grain down to the market town",
    "class Cache:\n    def __init__(self, size):",
    "To sort a list of records by date, first parse each timestamp",
)
WORKER = r"""
import asyncio, json, sys
from edge0.runtime.engine.api import Engine

args = json.loads(sys.argv[1])

async def main():
    out = []
    async with Engine.open(args["model"], **args["opts"]) as eng:
        ids = [list(eng.tokenizer.encode(p))[: args["prompt_len"]] for p in args["prompts"]]
        _ = [t async for t in eng.tokens(ids[0], max_tokens=4, stop=False)]  # warm-up

        async def one(prompt):
            toks = [t async for t in eng.tokens(prompt, max_tokens=args["tokens"], stop=False)]
            out.append({"tokens": toks, "stats": eng.last_stats.to_dict()})

        prof = None
        if args["profile"]:  # cProfile of the compute thread only, in its CPU time
            import cProfile, time
            prof = cProfile.Profile(time.thread_time)
            await eng._compute.run(prof.enable)
        import time
        c0 = time.thread_time()  # this thread is the event loop's
        if args["clients"] > 1:
            await asyncio.gather(*(one(p) for p in ids[: args["clients"]]))
        else:
            for p in ids:
                await one(p)
        loop_cpu = time.thread_time() - c0
        n_tok = sum(len(r["tokens"]) for r in out)
        for r in out:  # the event loop's CPU time over the measured requests, per token
            r["stats"]["loop_cpu_ms_per_token"] = loop_cpu / max(n_tok, 1) * 1e3
        if prof is not None:
            await eng._compute.run(prof.disable)
            prof.dump_stats(args["profile"])
    print(json.dumps(out))

asyncio.run(main())
"""
COLUMNS = (
    ("decode tok/s", "decode_tps", "{:.1f}"),
    ("CPU ms/layer", "overhead_cpu_ms_per_layer", "{:.3f}"),
    ("host syncs/token", "syncs_per_token", "{:.1f}"),
    ("compute ms/step", "compute_ms_per_step", "{:.1f}"),
    ("blocked ms/step", "blocked_ms_per_step", "{:.2f}"),
    ("loop lag max ms", "loop_max_lag_ms", "{:.1f}"),
    ("loop lag p99 ms", "loop_p99_lag_ms", "{:.1f}"),
    ("loop CPU ms/token", "loop_cpu_ms_per_token", "{:.2f}"),
)


def run_variant(
    tree: Path,
    model: str,
    mode: str,
    group: int | None,
    tiers: str,
    tokens: int,
    prompt_len: int,
    clients: int,
    prompts: int = 4,
    profile: str | None = None,
) -> list[dict[str, Any]]:
    opts: dict[str, Any] = {"mode": mode, "tiers": tiers}
    if group is not None:
        opts["sync_every"] = group
    args = {
        "model": model,
        "opts": opts,
        "prompts": list(PROMPTS[:prompts]),
        "tokens": tokens,
        "prompt_len": prompt_len,
        "clients": clients,
        "profile": profile,
    }
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(args)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise click.ClickException(f"{tree} {mode}: {proc.stderr.strip()[-2000:]}")
    result: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def parse_variant(text: str, trees: dict[str, Path]) -> tuple[str, Path, str, int | None]:
    tree, _, rest = text.partition(":")
    mode, _, group = rest.partition("@")
    if tree not in trees or not mode:
        raise click.BadParameter(f"{text!r}: want TREE:MODE[@G] with TREE in {sorted(trees)}")
    return text, trees[tree], mode, int(group) if group else None


@click.command()
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.option("--tree", "tree_specs", multiple=True, help="NAME=PATH of a checkout to run.")
@click.option("--variants", default="now:resident,now:route", show_default=True)
@click.option("--rounds", default=3, show_default=True)
@click.option("--tokens", default=24, show_default=True, help="Decode tokens per request.")
@click.option("--prompt-len", default=8, show_default=True)
@click.option("--clients", default=1, show_default=True, help="Concurrent requests (<= 4).")
@click.option("--prompts", default=4, show_default=True, help="Measured requests (<= 4).")
@click.option("--tiers", default="ram:1GiB>pread", show_default=True)
@click.option(
    "--ratio",
    "ratio_specs",
    multiple=True,
    help="A/B: per round, variant A's median decode tok/s and blocked ms/step over B's.",
)
@click.option(
    "--gguf",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The same model as a GGUF file: llama.cpp decodes it once a round, after the variants.",
)
@click.option(
    "--llama-python",
    default=sys.executable,
    show_default="this Python",
    help="A Python with llama-cpp-python installed, for --gguf.",
)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
@click.option(
    "--profile",
    "profile_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write a cProfile (thread CPU time) of each variant's compute thread (last round) here.",
)
def main(
    model: str,
    tree_specs: tuple[str, ...],
    variants: str,
    rounds: int,
    tokens: int,
    prompt_len: int,
    clients: int,
    prompts: int,
    tiers: str,
    ratio_specs: tuple[str, ...],
    gguf: str | None,
    llama_python: str,
    json_out: str | None,
    profile_dir: str | None,
) -> None:
    model = str(Path(model).resolve())  # each variant runs in its own tree's directory
    trees = {"now": Path(__file__).resolve().parents[2]}
    for spec in tree_specs:
        name, _, path = spec.partition("=")
        trees[name] = Path(path).resolve()
    chosen = [parse_variant(v, trees) for v in variants.split(",")]
    pairs = [tuple(spec.split("/")) for spec in ratio_specs]
    for pair in pairs:
        if len(pair) != 2 or not set(pair) <= {v[0] for v in chosen}:
            raise click.BadParameter(f"--ratio {'/'.join(pair)}: want A/B, two of the variants")
    runs: dict[str, list[list[dict[str, Any]]]] = {v[0]: [] for v in chosen}
    load = []
    llama: list[dict[str, Any]] = []
    for r in range(rounds):
        for label, tree, mode, group in chosen:
            prof = None
            if profile_dir and r == rounds - 1:
                Path(profile_dir).mkdir(parents=True, exist_ok=True)
                prof = str(Path(profile_dir, label.replace(":", "-") + ".prof").resolve())
            runs[label].append(
                run_variant(
                    tree, model, mode, group, tiers, tokens, prompt_len, clients, prompts, prof
                )
            )
            load.append(os.getloadavg()[0])
            click.echo(f"round {r + 1} {label}: done (load {load[-1]:.1f})", err=True)
        if gguf is not None:
            llama.append(run_llama(llama_python, gguf, trees["now"], prompt_len, tokens, prompts))
            load.append(os.getloadavg()[0])
            click.echo(f"round {r + 1} llama.cpp: {llama[-1]['decode_tps']:.1f} tok/s", err=True)
    header = ["variant", "requests", *[c[0] for c in COLUMNS], "wasted / issued tickets"]
    click.echo("| " + " | ".join(header) + " |")
    click.echo("|" + "---|" * len(header))
    for label, rounds_ in runs.items():
        stats = [req["stats"] for rnd in rounds_ for req in rnd]
        cells = [
            fmt.format(statistics.median(s.get(key, float("nan")) for s in stats))
            for _, key, fmt in COLUMNS
        ]
        wasted, issued = (sum(s[f"tickets_{k}"] for s in stats) for k in ("wasted", "issued"))
        waste = f"{wasted} / {issued}"
        click.echo(f"| {label} | {len(stats)} | " + " | ".join(cells) + f" | {waste} |")
    for name in trees:
        res = f"{name}:resident"
        route = next((v for v in runs if v.startswith(f"{name}:route")), None)
        if res in runs and route is not None:
            ratios = []
            for a, b in zip(runs[route], runs[res], strict=True):
                cpu = [
                    statistics.median(q["stats"]["overhead_cpu_ms_per_layer"] for q in x)
                    for x in (a, b)
                ]
                ratios.append(cpu[0] - cpu[1])
            click.echo(
                f"{name}: {route} minus resident, CPU ms/layer per round: "
                + ", ".join(f"{x:.3f}" for x in ratios)
                + f" (median {statistics.median(ratios):.3f})"
            )
    ratios = {"/".join(pair): per_round(runs[pair[0]], runs[pair[1]]) for pair in pairs}
    for name, got in ratios.items():
        for key, values in got.items():
            click.echo(
                f"{name} {key} per round: "
                + ", ".join(f"{x:.3f}" for x in values)
                + f" (median {statistics.median(values):.3f})"
            )
    if llama:
        tps = [x["decode_tps"] for x in llama]
        click.echo(
            "llama.cpp (1 thread) decode tok/s per round: "
            + ", ".join(f"{x:.1f}" for x in tps)
            + f" (median {statistics.median(tps):.1f})"
        )
    click.echo(f"load average during the runs: {min(load):.1f}-{max(load):.1f}")
    if json_out:
        out = {"variants": variants, "runs": runs, "load": load, "ratios": ratios}
        if llama:
            out["llama"] = llama
        Path(json_out).write_text(json.dumps(out, indent=1))


def run_llama(
    python: str, gguf: str, tree: Path, prompt_len: int, tokens: int, prompts: int
) -> dict[str, Any]:
    """llama.cpp's greedy decode of the same model (edge0.bench.llama_peer, one thread), in a
    process of its own as each variant runs."""
    with tempfile.TemporaryDirectory(prefix="edge0-llama-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [python, "-m", "edge0.bench.llama_peer", str(Path(gguf).resolve())]
        cmd += ["--json", str(out), "--prompt-len", str(prompt_len), "--tokens", str(tokens)]
        cmd += ["--prompts", str(prompts), "--threads", "1"]
        env = dict(os.environ, PYTHONPATH=str(tree))
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not out.exists():
            raise click.ClickException(f"llama.cpp: {proc.stderr.strip()[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def per_round(
    a: list[list[dict[str, Any]]], b: list[list[dict[str, Any]]]
) -> dict[str, list[float]]:
    """Per round: A's median (over its requests) decode tok/s and blocked ms/step over B's."""
    out: dict[str, list[float]] = {}
    for key in ("decode_tps", "blocked_ms_per_step"):
        out[key] = [
            statistics.median(q["stats"][key] for q in x)
            / max(statistics.median(q["stats"][key] for q in y), 1e-9)
            for x, y in zip(a, b, strict=True)
        ]
    return out


if __name__ == "__main__":
    main()
