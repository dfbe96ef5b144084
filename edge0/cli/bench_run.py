"""`edge0 bench run` and `edge0 bench sweep`: end-to-end decode benchmarks (`bench` group)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edge0.cli.checks import runtime_args, tier_spec
from edge0.cli.options import engine_options


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def common(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `run` and `sweep`: run shape, isolation, outputs."""
    options = [
        click.argument("model", type=click.Path(exists=True, file_okay=False, path_type=Path)),
        click.option("--prompts", default=2, show_default=True, help="Prompts per run."),
        click.option("--prompt-len", default=16, show_default=True, help="Tokens per prompt."),
        click.option("--tokens", default=16, show_default=True, help="Decode tokens per prompt."),
        click.option(
            "--repeats",
            default=3,
            show_default=True,
            help="Rounds; each runs every variant once (A B A B ...).",
        ),
        click.option(
            "--warmup-tokens",
            default=4,
            show_default=True,
            help="Tokens of an unmeasured warm-up request in each run.",
        ),
        click.option(
            "--isolate",
            type=click.Choice(["subprocess", "process"]),
            default="subprocess",
            show_default=True,
            help="One process per run "
            "(own peak RSS) or all in this one (VmHWM reset via clear_refs).",
        ),
        click.option(
            "--cold",
            is_flag=True,
            help="Drop the page cache of the expert file "
            "(posix_fadvise DONTNEED) before each measured prompt.",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            default=900.0,
            show_default=True,
            help="Seconds before a run is stopped.",
        ),
        click.option(
            "--mem-floor",
            default="1.5GiB",
            show_default=True,
            help="Stop a run when the machine's MemAvailable falls below this.",
        ),
        click.option(
            "--plot",
            "plot_dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="Write PNG plots into this directory.",
        ),
        click.option(
            "--json",
            "json_out",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Write every run and the medians as JSON.",
        ),
        click.option(
            "--md",
            "md_out",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Write a markdown result file (with this command).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


# the engine options the benchmarks take one value of, for every variant
ENGINE_ONCE = ("memory_budget", "first_layer", "io_workers")


def _options(kw: dict[str, Any]) -> Any:
    from edge0.bench.run import BenchOptions
    from edge0.storage.spec import parse_size

    return BenchOptions(
        model=kw["model"],
        prompts=kw["prompts"],
        prompt_len=kw["prompt_len"],
        tokens=kw["tokens"],
        repeats=kw["repeats"],
        warmup_tokens=kw["warmup_tokens"],
        isolate=kw["isolate"],
        cold=kw["cold"],
        engine={k: kw[k] for k in ENGINE_ONCE if kw[k] is not None},
        timeout_s=kw["timeout_s"],
        mem_floor=parse_size(kw["mem_floor"]),
    )


def llama_options(where: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--gguf` and `--llama-threads`: llama.cpp beside Edge0, run `where`."""

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option(
            "--llama-threads", default=1, show_default=True, help="llama.cpp's threads (--gguf)."
        )(fn)
        return click.option(
            "--gguf",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=None,
            help=f"The same model as a GGUF file: llama.cpp (llama-cpp-python) decodes it {where}.",
        )(fn)

    return add


def llama_peer(gguf: Path | None, threads: int, repack: bool = True) -> Any:
    """llama.cpp beside Edge0 (--gguf), or None; one line when it cannot run. `repack` False
    keeps its weights in the file mapping (inside a memory cap smaller than the model)."""
    if gguf is None:
        return None
    from edge0.bench.llama_peer import Peer, missing
    from edge0.errors import ConfigError

    why = missing(gguf)
    if why is not None:
        raise ConfigError(why)
    return Peer(gguf, threads, repack)


def _peer_report(peer: Any, got: list[dict[str, Any]], variants: Any, runs: Any) -> dict:
    """llama.cpp's runs, their median decode tok/s, the variants over it per round."""
    import statistics

    from edge0.bench import run as bench_run

    ok = [r["decode_tps"] for r in got if r.get("decode_tps")]
    med = statistics.median(ok) if ok else None
    tps = "no figure (" + "; ".join(r.get("error", "?") for r in got) + ")"
    if med is not None:
        tps = f"{med:.2f} decode tok/s (median of {len(ok)} rounds: "
        tps += ", ".join(f"{x:.2f}" for x in ok) + ")"
    line = f"llama.cpp ({peer.gguf.name}, {peer.threads} thread(s)): {tps}"
    ratios = bench_run.peer_ratios(variants, {**runs, peer.label: got})
    return {
        "gguf": str(peer.gguf),
        "threads": peer.threads,
        "runs": got,
        "decode_tps": med,
        "ratios": ratios,
        "line": line,
    }


def _progress(rnd: int, v: Any, res: dict[str, Any]) -> None:
    s = res.get("summary")
    what = (
        f"{s['decode_tps']:.2f} tok/s, blocked {s['blocked_ms_per_step']:.1f} ms/step, "
        f"prefill {s['prefill_tps']:.2f} tok/s"
        if s and not res.get("error")
        else f"failed: {res.get('error')}"
    )
    click.echo(f"round {rnd + 1}  {v.label}: {what}", err=True)


def _command_line() -> str:
    return " ".join(shlex.quote(a) for a in ["edge0", *sys.argv[1:]])


def _traces(variants: list[Any], opts: Any, plot_dir: Path) -> dict[str, Path]:
    """One extra traced run of the first reactive and route/hint variants (not measured)."""
    from edge0.bench.run import make_job, run_one

    chosen: dict[str, Any] = {}
    for v in variants:
        if v.mode != "resident":
            chosen.setdefault(v.mode, v)
    out = {}
    for mode in ("reactive", "hint", "route"):
        if mode in chosen:
            v = chosen[mode]
            path = plot_dir / "traces" / f"{mode}.json"
            path.parent.mkdir(exist_ok=True)
            job = make_job(v, opts, -1, trace=str(path.resolve()))
            job["prompts"] = 1
            res = run_one(job, opts)
            if not res.get("error") and path.is_file():
                out[v.label] = path
    return out


def _write(
    report: dict[str, Any], kw: dict[str, Any], title: str, body: str, plots: list[Path]
) -> None:
    if kw["json_out"] is not None:
        kw["json_out"].write_text(json.dumps(report, indent=1))
        click.echo(f"wrote {kw['json_out']}", err=True)
    if kw["md_out"] is not None:
        o = report["options"]
        m = report["machine"]
        lines = [
            f"# {title}",
            "",
            "Command:",
            "",
            "```",
            report["command"],
            "```",
            "",
            f"Model `{o['model']}`; {o['repeats']} interleaved rounds x {o['prompts']} prompts "
            f"of {o['prompt_len']} tokens, {o['tokens']} decode tokens each (after a "
            f"{o['warmup_tokens']}-token warm-up request per run); isolation: {o['isolate']}; "
            f"cold: {o['cold']}; machine: {m['cpus']} CPUs, load average "
            f"{m['load_average_end']:.1f} at the end.",
            "",
            body,
            "",
        ]
        rel = [os.path.relpath(p, kw["md_out"].parent) for p in plots]
        lines += [f"![{Path(r).stem}]({r})" for r in rel]
        kw["md_out"].write_text("\n".join(lines) + "\n")
        click.echo(f"wrote {kw['md_out']}", err=True)


@click.command(name="run")
@common
@engine_options("bench")
@click.option(
    "--io-ratio",
    type=float,
    default=None,
    help="Add a throttle>pread stack "
    "calibrated so reactive's reads per step take this many times its compute.",
)
@click.option(
    "--kernels",
    default="native",
    show_default=True,
    help="Matrix kernels to compare (comma-separated: native, native:N = N threads "
    "per call, native-int8 = with EDGE0_INT8_ACTIVATIONS=1, mlx = MLX's own ops, as "
    "with EDGE0_NATIVE_KERNELS=0); each variant runs once per choice.",
)
@llama_options(
    "in each round after the variants (its own process, greedy, the same prompt length and tokens)"
)
def run_cmd(**kw: Any) -> None:
    """Decode benchmark: modes x K x tier stacks, interleaved rounds, medians and spread.

    The tier stack defaults to ram:1GiB>pread, or ram>pread under --memory-budget (the plan
    sizes `ram`); with --io-ratio, only the calibrated stack."""
    runtime_args({"memory_budget": kw["memory_budget"]})  # before MLX's import and any worker
    for spec in kw["tiers"]:
        runtime_args({"tiers": spec})
    from edge0.bench import prefill as bench_prefill
    from edge0.bench import run as bench_run

    opts = _options(kw)
    opts.check()
    ks = kw["top_k"]
    default = "ram>pread" if kw["memory_budget"] else "ram:1GiB>pread"  # the plan sizes `ram`
    specs = list(kw["tiers"]) or ([] if kw["io_ratio"] is not None else [default])
    extra = ""
    if kw["io_ratio"] is not None:
        spec, cal = bench_run.calibrate(opts, ks[0], kw["io_ratio"])
        extra = (
            f"Calibration (reactive over the page cache): compute "
            f"{cal['compute_ms_per_step']:.1f} ms/step, reads "
            f"{cal['decode_bytes_per_step'] / 2**20:.2f} MiB/step -> `{spec}` "
            f"(reads = {kw['io_ratio']:g} x compute)."
        )
        click.echo(extra, err=True)
        specs.append(spec)
    kernels = _csv(kw["kernels"])
    for name in kernels:
        threads = name.partition(":")[2]
        if name not in ("native", "native-int8", "mlx") and not (
            name.startswith("native:") and threads.isdigit() and 1 <= int(threads) <= 64
        ):
            raise click.BadParameter(
                f"unknown kernels {name!r}; choose from native, native:N "
                "(N threads per call, 1-64), native-int8, mlx"
            )
    variants = bench_run.make_variants(
        kw["mode"],
        ks,
        specs,
        kw["predictor"],
        kw["prefill_chunk"],
        kw["route_policy"],
        kw["route_deadline_ms"],
        kernels,
        kw["sync_every"],
        kw["prefetch_width"],
    )
    peer = llama_peer(kw["gguf"], kw["llama_threads"])
    runs = bench_run.run_rounds(variants, opts, _progress, peer)
    report = bench_run.report(variants, opts, runs, _command_line())
    report["calibration"] = extra or None
    report["prefill_ratios"] = bench_prefill.prefill_ratios(variants, runs)
    body = report["table"] + "\n\n" + bench_run.ratio_lines(report["ratios"])
    if report["policy_ratios"]:
        body += "\n" + bench_run.ratio_lines(report["policy_ratios"])
    if report["sync_ratios"]:
        body += "\n" + bench_run.ratio_lines(report["sync_ratios"])
    if report["prefill_ratios"]:
        body += "\n" + bench_prefill.ratio_lines(report["prefill_ratios"])
    if peer is not None:
        report["llama_cpp"] = _peer_report(peer, runs.pop(peer.label), variants, runs)
        body += "\n" + report["llama_cpp"]["line"]
        body += "\n" + bench_run.ratio_lines(report["llama_cpp"]["ratios"])
    if extra:
        body = extra + "\n\n" + body
    plots: list[Path] = []
    if kw["plot_dir"] is not None:
        from edge0.bench import plot as bench_plot

        kw["plot_dir"].mkdir(parents=True, exist_ok=True)
        if any(v.get("runs_ok") for v in report["variants"]):
            plots.append(bench_plot.bars(report, kw["plot_dir"] / "bars.png"))
        traces = _traces(variants, opts, kw["plot_dir"])
        if traces:
            plots.append(bench_plot.timeline(traces, kw["plot_dir"] / "timeline.png"))
        report["plots"] = [str(p) for p in plots]
    click.echo(body)
    _write(report, kw, "edge0 bench run", body, plots)


@click.command(name="sweep")
@common
@engine_options("sweep")
@click.option(
    "--bandwidths",
    default="0.1,0.2,0.4,0.8,1.6,3.2",
    show_default=True,
    help="Emulated storage bandwidths in GB/s.",
)
@click.option("--lat", default="100us", show_default=True, help="Throttle latency per read.")
@click.option("--inner", default="pread", show_default=True, help="Tier under the throttle.")
@click.option(
    "--bounds",
    default="resident",
    show_default=True,
    help="Unthrottled reference variants: resident and/or route (over --inner).",
)
def sweep_cmd(**kw: Any) -> None:
    """Decode tok/s against emulated storage bandwidth (throttle tier), with the compute bound."""
    tier_spec(kw["inner"], "--inner")
    runtime_args({"memory_budget": kw["memory_budget"]})
    from edge0.bench import run as bench_run
    from edge0.bench import sweep as bench_sweep

    opts = _options(kw)
    sweep = bench_sweep.Sweep(
        bench_sweep.parse_bandwidths(kw["bandwidths"]),
        tuple(kw["mode"]),
        kw["top_k"],
        kw["lat"],
        kw["inner"],
        tuple(_csv(kw["bounds"])),
        kw["predictor"],
    )
    variants = sweep.variants()
    runs = bench_run.run_rounds(variants, opts, _progress)
    report = bench_run.report(variants, opts, runs, _command_line())
    report["sweep"] = {**bench_sweep.curves(sweep, report), "bandwidths_gbs": sweep.bandwidths}
    body = bench_sweep.table(sweep, report)
    plots: list[Path] = []
    if kw["plot_dir"] is not None:
        from edge0.bench import plot as bench_plot

        kw["plot_dir"].mkdir(parents=True, exist_ok=True)
        c = report["sweep"]
        title = f"{Path(kw['model']).name}, K={kw['top_k'] or 'model'}, throttle lat {kw['lat']}"
        plots.append(
            bench_plot.sweep_plot(c["points"], c["bounds"], kw["plot_dir"] / "sweep.png", title)
        )
        report["plots"] = [str(p) for p in plots]
    click.echo(body)
    _write(report, kw, "edge0 bench sweep", body, plots)


def register(group: click.Group) -> None:
    """Add `run` and `sweep` to the `edge0 bench` group."""
    group.add_command(run_cmd)
    group.add_command(sweep_cmd)
