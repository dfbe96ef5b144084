"""`edge0 serve`: the OpenAI- and Anthropic-compatible HTTP server (uvicorn, one event loop)."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from types import FrameType
from typing import Any

import click

from edge0.cli.checks import model_arg
from edge0.cli.options import engine_options, log_json_option, take
from edge0.cli.serve_limits import limit_options, take_limits
from edge0.errors import ConfigError, Edge0Error
from edge0.options.engine import EngineOptions

LOOPBACK = ("127.0.0.1", "::1", "localhost")
MAX_BODY_RANGE = (1 << 10, 1 << 30)  # --max-body: 1 KiB .. 1 GiB (bodies are held in memory)
MAX_GRACE_S = 3600.0


class Terminated(Exception):
    """SIGTERM arrived: stop as on Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def check_options(
    max_body: str,
    grace: float,
    model_name: str | None,
    api_key: str | None,
    engine: dict[str, Any],
    log_json: str | None,
) -> int:
    """The server options checked before any work; returns --max-body in bytes."""
    from edge0.cli.checks import runtime_args
    from edge0.storage.spec import parse_size

    try:
        limit = parse_size(max_body)
    except ValueError as exc:
        raise ConfigError(f"--max-body: {exc}") from None
    lo, hi = MAX_BODY_RANGE
    if not lo <= limit <= hi:
        raise ConfigError(f"--max-body {max_body} is {limit} bytes; give 1KiB to 1GiB")
    if not 0 <= grace <= MAX_GRACE_S:  # also refuses nan
        raise ConfigError(f"--shutdown-grace {grace} must be between 0 and {MAX_GRACE_S:g} seconds")
    for flag, text in (("--model-name", model_name), ("--api-key", api_key)):
        if text is not None and not (
            text.isascii() and text.isprintable() or flag == "--model-name" and _utf8(text)
        ):
            raise ConfigError(
                f"{flag} {text!r} cannot be sent over HTTP; use printable "
                f"{'ASCII' if flag == '--api-key' else 'UTF-8 text'}"
            )
    runtime_args(engine, log_json)
    return limit


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an argument with undecodable bytes (surrogate escapes)
        return False
    return text.isprintable()


def listen(host: str, port: int) -> socket.socket:
    """A bound socket (port 0: a free one), or a ConfigError that says what to change."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"--host {host!r} is not an address to listen on: {exc}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}; pick another "
            "--port (0 takes a free one)"
        ) from None
    return sock


class _QuietStartupFailure(logging.Filter):
    """Drops uvicorn's traceback of a startup Edge0Error (the CLI prints it as one line)."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app

    def filter(self, record: logging.LogRecord) -> bool:
        failed = isinstance(getattr(self.app.state, "startup_error", None), Edge0Error)
        return not (failed and str(record.msg).startswith(("Traceback", "Application startup")))


@click.command("serve")
@click.argument("model", required=False)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; anything but loopback wants --api-key.",
)
@click.option(
    "--port",
    default=8080,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="TCP port (0: a free one, printed at start).",
)
@click.option(
    "--api-key",
    envvar="EDGE0_API_KEY",
    default=None,
    help="Key every request must send (Authorization: Bearer KEY or x-api-key) "
    "[env: EDGE0_API_KEY].",
)
@click.option(
    "--model-name",
    default=None,
    help="Model id clients see and send "
    "[default: edge0-demo for the demo model, else the directory name].",
)
@click.option(
    "--max-body",
    default="1MiB",
    show_default=True,
    help="Largest request body; bigger ones get 413.",
)
@click.option(
    "--shutdown-grace",
    "grace",
    default=5.0,
    show_default=True,
    type=float,
    help="Seconds that requests in flight get to finish on Ctrl-C or SIGTERM; those still "
    "running then end with a 503 error in the API's shape.",
)
@click.option(
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    help="Log one line per HTTP request (uvicorn's access log).",
)
@limit_options
@engine_options("serve")
@log_json_option
def command(
    model: str | None,
    host: str,
    port: int,
    api_key: str | None,
    model_name: str | None,
    max_body: str,
    grace: float,
    access_log: bool,
    run_log_json: str | None,
    **kw: Any,
) -> None:
    """Serve MODEL (an edge0-layout directory or a Hugging Face id ORG/NAME[@REVISION],
    downloaded and converted on first use; default: the demo model) over HTTP.

    OpenAI: GET /v1/models, POST /v1/completions, POST /v1/chat/completions.
    Anthropic: POST /v1/messages. GET /health, GET /metrics (Prometheus).
    Streaming answers are server-sent events; a client that disconnects cancels
    its request. Ctrl-C and SIGTERM stop it gracefully (--shutdown-grace). The
    limits (connections, timeouts, queue) are in docs/server.md; the engine options
    are those of `edge0 run`.
    """
    from edge0 import heap

    heap.limit_arenas()  # before any thread starts (docs/server.md, "Memory")

    from edge0 import log
    from edge0.cli.stream import is_layout
    from edge0.loop import run
    from edge0.model.demo import default_model_path
    from edge0.server.app import ServerConfig, create_app
    from edge0.server.connections import uvicorn_config
    from edge0.server.drain import DrainingServer

    limits = take_limits(kw)
    engine = take(EngineOptions, "serve", kw)
    limit = check_options(max_body, grace, model_name, api_key, engine, run_log_json)
    EngineOptions(**engine).check()  # the engine's own checks before any work
    if run_log_json is not None:
        log.configure(json_file=run_log_json)
    hub = model_arg(model)
    if model is None:
        path = default_model_path()
    else:
        from edge0.hub.resolve import runnable

        path = runnable(model, progress=sys.stderr.isatty())
    if not is_layout(path):
        raise ConfigError(
            f"{path} is not an edge0-layout directory; `edge0 serve` streams "
            f"experts from one: run `edge0 convert {path} OUT` first"
        )
    default_id = path.resolve().name if hub is None else hub.repo
    model_id = model_name or ("edge0-demo" if model is None else default_id)
    if host not in LOOPBACK and not api_key:
        click.echo(f"edge0 serve: warning: listening on {host} without --api-key", err=True)
    sock = listen(host, port)
    bound = sock.getsockname()[1]

    def ready(engine: Any) -> None:
        plan = engine.setup.memory_plan
        if plan is not None:
            click.echo(plan.line(), err=True)
        click.echo(
            f"edge0 serve: {model_id} ({engine.options.mode}) on "
            f"http://{host}:{bound}/v1 (Ctrl-C stops)",
            err=True,
        )

    config = ServerConfig(
        model=path,
        engine=engine,
        model_id=model_id,
        api_key=api_key or None,
        max_body=limit,
        limits=limits,
        on_ready=ready,
    )
    app = create_app(config)
    quiet = _QuietStartupFailure(app)
    if not click.get_current_context().meta.get("edge0.debug"):
        logging.getLogger("uvicorn.error").addFilter(quiet)
    level = "info" if access_log else "warning"
    server = DrainingServer(
        uvicorn_config(app, limits, app.state.metrics, level, access_log), config.drain, grace
    )
    # uvicorn handles SIGTERM like SIGINT, then re-raises it: ours ends the command as Ctrl-C
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        run(server.serve(sockets=[sock]))
    except (KeyboardInterrupt, Terminated):
        pass
    except SystemExit:  # uvicorn's exit when the lifespan (opening the engine) failed
        error = getattr(app.state, "startup_error", None)
        if isinstance(error, Edge0Error):
            raise error from None  # one line (the CLI's handler); uvicorn logged nothing
        raise  # anything else: uvicorn has logged its traceback
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        logging.getLogger("uvicorn.error").removeFilter(quiet)
    click.echo("edge0 serve: stopped", err=True)
