"""The `edge0` command: a click group; each subcommand lives in `edge0/cli/`."""

from __future__ import annotations

import sys
from typing import Any

import click

from edge0 import log
from edge0.cli.signals import INTERRUPTED, sigterm_as_ctrl_c
from edge0.errors import Edge0Error


class Edge0Group(click.Group):
    """Turns Edge0Error into a one-line message and exit code 2 (traceback with --debug), and
    Ctrl-C or SIGTERM into `edge0: interrupted` and exit code 130 (edge0.cli.signals)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with sigterm_as_ctrl_c():
                return super().invoke(ctx)
        except Edge0Error as exc:
            if ctx.meta.get("edge0.debug"):
                raise
            click.echo(f"edge0: error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("\nedge0: interrupted", err=True)
            sys.exit(INTERRUPTED)


@click.group(cls=Edge0Group)
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.option(
    "--log-json",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write every structlog event as JSON lines to this file ('-' = stderr).",
)
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Level of human-readable logs on stderr.",
)
@click.version_option(package_name="edge0")
@click.pass_context
def main(ctx: click.Context, debug: bool, log_json: str | None, log_level: str) -> None:
    """Edge0: run Mixture-of-Experts models larger than memory by streaming experts."""
    from edge0.cli.checks import output_file

    ctx.meta["edge0.debug"] = debug
    output_file(log_json, "--log-json")
    log.configure(level=log_level, json_file=log_json)


def _register() -> None:
    # Each subcommand module defines one click command (or group) named `command`.
    from edge0.cli import run

    main.add_command(run.command)

    from edge0.cli import serve

    main.add_command(serve.command)

    from edge0.cli import convert, doctor, verify

    main.add_command(doctor.command)

    main.add_command(convert.command)
    main.add_command(verify.command)

    from edge0.cli import eval as eval_cmd
    from edge0.cli import synth, train, tune

    main.add_command(tune.command)
    main.add_command(synth.command)

    main.add_command(train.command)
    main.add_command(eval_cmd.command)

    from edge0.cli import bench, bench_batch, bench_kernels, bench_prefill, bench_run

    main.add_command(bench.command)
    bench_run.register(bench.command)
    bench.command.add_command(bench_batch.command)
    bench.command.add_command(bench_kernels.command)
    bench.command.add_command(bench_prefill.command)


_register()
