"""`edge0 run`: generate text from a prompt; text streams to stdout, one stats line to stderr."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from edge0.cli.checks import model_arg, read_stdin_text, runtime_args, streaming_only_flags
from edge0.cli.dist_flags import resolve
from edge0.cli.options import (
    engine_options,
    log_json_option,
    sampling_options,
    stats_option,
    take,
)
from edge0.cli.stream import is_layout, run_streaming
from edge0.errors import ConfigError, PromptError
from edge0.options.engine import EngineOptions
from edge0.options.sampling import SamplingSettings


def read_prompt(prompt: str) -> str:
    """The prompt text; "-" reads all of stdin."""
    if prompt == "-":
        text = read_stdin_text()
        if not text.strip():
            raise PromptError("`-p -` read an empty prompt from stdin; pipe some text in")
        return text
    return prompt


@click.command("run")
@click.argument("model", required=False)
@click.option("-p", "--prompt", required=True, help='Prompt text, or "-" to read stdin.')
@sampling_options
@click.option(
    "--chat/--no-chat",
    default=True,
    show_default=True,
    help="Wrap the prompt in the tokenizer's chat template (if it has one).",
)
@engine_options("run")
@log_json_option
@stats_option
def command(
    model: str | None,
    prompt: str,
    chat: bool,
    run_log_json: str | None,
    stats: str,
    verbose: bool,
    **kw: Any,
) -> None:
    """Generate text with MODEL (a model directory or a Hugging Face id ORG/NAME[@REVISION],
    downloaded and converted on first use; default: the demo model).

    Text streams to stdout as it is generated. Then one line of statistics goes to
    stderr: prompt and decode tokens per second, peak MLX memory and peak RSS, and for
    a streamed run MiB read per token and blocked-load ms per decode step. `--stats
    full` (or -v) adds the mode, compute, host syncs, overlap, prefill reads, hit rates,
    tickets and event-loop lag. Under --memory-budget the memory plan's line comes first.
    """
    engine = resolve(take(EngineOptions, "run", kw))
    settings = SamplingSettings(**take(SamplingSettings, "run", kw))
    full = stats == "full" or verbose
    dist = "hosts" in engine
    # 1. every argument check that needs no MLX, mlx-lm or transformers import
    hub = model_arg(model)
    runtime_args(engine, run_log_json)
    text = read_prompt(prompt)
    ctx = click.get_current_context()
    if model is not None and hub is None and not is_layout(Path(model)):
        streaming_only_flags(ctx, f"{model} is not an edge0-layout directory")
    elif engine.get("mode") == "resident" and not dist:
        streaming_only_flags(ctx, "--mode resident runs the resident loop")
    # 2. then the heavy imports, the demo model and the work
    from edge0.model.demo import default_model_path
    from edge0.model.generate import encode_prompt, generate
    from edge0.model.loader import load
    from edge0.model.lora import maybe_apply_adapters

    if model is None:
        path = default_model_path()
    else:
        from edge0.hub.resolve import runnable

        path = runnable(model, progress=sys.stderr.isatty())
    if is_layout(path) and (engine.get("mode") != "resident" or dist):
        # the streaming engine (docs/runtime.md)
        run_streaming(path, text, chat, settings, engine, run_log_json, full=full)
        return
    if engine.get("mode") not in (None, "resident"):
        raise ConfigError(
            f"--mode {engine['mode']} streams experts from an edge0-layout directory; "
            f"convert {path} first with `edge0 convert {path} OUT`"
        )
    loaded = load(path)
    maybe_apply_adapters(loaded.model, path, enabled=engine["adapter"])
    tokens = encode_prompt(loaded.tokenizer, text, chat=chat)
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
