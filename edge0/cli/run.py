"""`edge0 run`: generate text from a prompt; text streams to stdout, one stats line to stderr."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from edge0.cli.checks import (
    model_dir,
    read_stdin_text,
    runtime_args,
    sampling_args,
    streaming_only_flags,
)
from edge0.cli.dist_flags import DIST_KEYS, dist_options, resolve
from edge0.cli.options import RUNTIME_KEYS, runtime_options, sampling_options, stats_option
from edge0.cli.stream import is_layout, run_streaming
from edge0.errors import ConfigError, PromptError


def read_prompt(prompt: str) -> str:
    """The prompt text; "-" reads all of stdin."""
    if prompt == "-":
        text = read_stdin_text()
        if not text.strip():
            raise PromptError("`-p -` read an empty prompt from stdin; pipe some text in")
        return text
    return prompt


@click.command("run")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@click.option("-p", "--prompt", required=True, help='Prompt text, or "-" to read stdin.')
@sampling_options
@click.option(
    "--chat/--no-chat",
    default=True,
    show_default=True,
    help="Wrap the prompt in the tokenizer's chat template (if it has one).",
)
@runtime_options
@stats_option
@dist_options
def command(model: Path | None, prompt: str, chat: bool, **sampling: Any) -> None:
    """Generate text with MODEL (a model directory; default: the demo model).

    Text streams to stdout as it is generated. Then one line of statistics goes to
    stderr: prompt and decode tokens per second, peak MLX memory and peak RSS, and for
    a streamed run MiB read per token and blocked-load ms per decode step. `--stats
    full` (or -v) adds the mode, compute, host syncs, overlap, prefill reads, hit rates,
    tickets and event-loop lag. Under --memory-budget the memory plan's line comes first.
    """
    runtime = {k: sampling.pop(k) for k in RUNTIME_KEYS}
    stats, verbose = sampling.pop("stats"), sampling.pop("verbose")
    full = stats == "full" or verbose
    runtime["dist"] = resolve({k: sampling.pop(k) for k in DIST_KEYS})
    # 1. every argument check that needs no MLX, mlx-lm or transformers import
    model_dir(model)
    runtime_args(runtime)
    sampling_args(sampling)
    text = read_prompt(prompt)
    ctx = click.get_current_context()
    if model is not None and not is_layout(model):
        streaming_only_flags(ctx, f"{model} is not an edge0-layout directory")
    elif runtime["mode"] == "resident" and not runtime["dist"]:
        streaming_only_flags(ctx, "--mode resident runs the resident loop")
    # 2. then the heavy imports, the demo model and the work
    from edge0.model.demo import default_model_path
    from edge0.model.generate import SamplingSettings, encode_prompt, generate
    from edge0.model.loader import load
    from edge0.model.lora import maybe_apply_adapters

    SamplingSettings(**sampling)  # the sampler's own last check of the values
    path = model if model is not None else default_model_path()
    if is_layout(path) and (runtime["mode"] != "resident" or runtime["dist"]):
        # the streaming engine (docs/runtime.md)
        run_streaming(path, text, chat, sampling, runtime, full=full)
        return
    if runtime["mode"] not in (None, "resident"):
        raise ConfigError(
            f"--mode {runtime['mode']} streams experts from an edge0-layout directory; "
            f"convert {path} first with `edge0 convert {path} OUT`"
        )
    loaded = load(path)
    maybe_apply_adapters(loaded.model, path, enabled=runtime["adapter"])
    tokens = encode_prompt(loaded.tokenizer, text, chat=chat)
    settings = SamplingSettings(**sampling)
    last = ""
    for piece in generate(loaded, tokens, settings):
        if piece.text:
            click.echo(piece.text, nl=False)
            sys.stdout.flush()
            last = piece.text
        if piece.stats is not None:
            if not last.endswith("\n"):
                click.echo("")
            click.echo(piece.stats.line(), err=True)
