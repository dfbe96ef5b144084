"""`edge0 serve`: the OpenAI- and Anthropic-compatible HTTP server (uvicorn, one event loop)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import click

from edge0.cli.options import (
    RUNTIME_KEYS,
    SERVE_MAX_BATCH,
    engine_kwargs,
    max_batch_option,
    runtime_options,
)
from edge0.errors import ConfigError, Edge0Error

LOOPBACK = ("127.0.0.1", "::1", "localhost")


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
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another "
                          "--port (0 takes a free one)") from None  # fmt: skip
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
@click.argument("model", required=False, type=click.Path(path_type=Path))
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
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    help="Log one line per HTTP request (uvicorn's access log).",
)
@max_batch_option(SERVE_MAX_BATCH)
@runtime_options
def command(
    model: Path | None, host: str, port: int, api_key: str | None, model_name: str | None,
    max_body: str, access_log: bool, max_batch: int, **kw: Any,
) -> None:  # fmt: skip
    """Serve MODEL (an edge0-layout directory; default: the demo model) over HTTP.

    OpenAI: GET /v1/models, POST /v1/completions, POST /v1/chat/completions.
    Anthropic: POST /v1/messages. GET /health, GET /metrics (Prometheus).
    Streaming answers are server-sent events; a client that disconnects cancels
    its request. The engine options are those of `edge0 run`.
    """
    import uvicorn

    from edge0 import log
    from edge0.cli.stream import is_layout
    from edge0.loop import run
    from edge0.model.demo import default_model_path
    from edge0.server.app import ServerConfig, create_app
    from edge0.storage.spec import parse_size

    runtime = {k: kw.pop(k) for k in RUNTIME_KEYS}
    if runtime["run_log_json"] is not None:
        log.configure(json_file=runtime["run_log_json"])
    path = model if model is not None else default_model_path()
    if not is_layout(path):
        raise ConfigError(f"{path} is not an edge0-layout directory; `edge0 serve` streams "
                          f"experts from one: run `edge0 convert {path} OUT` first")  # fmt: skip
    model_id = model_name or ("edge0-demo" if model is None else path.resolve().name)
    limit = parse_size(max_body)
    if host not in LOOPBACK and not api_key:
        click.echo(f"edge0 serve: warning: listening on {host} without --api-key", err=True)
    sock = listen(host, port)
    bound = sock.getsockname()[1]

    def ready(engine: Any) -> None:
        plan = engine.setup.memory_plan
        if plan is not None:
            click.echo(plan.line(), err=True)
        click.echo(f"edge0 serve: {model_id} ({engine.options.mode}) on "
                   f"http://{host}:{bound}/v1 (Ctrl-C stops)", err=True)  # fmt: skip

    engine = engine_kwargs(runtime) | {"max_batch": max_batch}
    config = ServerConfig(model=path, engine=engine, model_id=model_id,
                          api_key=api_key or None, max_body=limit, on_ready=ready)  # fmt: skip
    app = create_app(config)
    quiet = _QuietStartupFailure(app)
    if not click.get_current_context().meta.get("edge0.debug"):
        logging.getLogger("uvicorn.error").addFilter(quiet)
    level = "info" if access_log else "warning"
    server = uvicorn.Server(uvicorn.Config(
        app, log_level=level, access_log=access_log, lifespan="on", loop="none",
        timeout_graceful_shutdown=5,
    ))  # fmt: skip
    try:
        run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
    except SystemExit:  # uvicorn's exit when the lifespan (opening the engine) failed
        error = getattr(app.state, "startup_error", None)
        if isinstance(error, Edge0Error):
            raise error from None  # one line (the CLI's handler); uvicorn logged nothing
        raise  # anything else: uvicorn has logged its traceback
    finally:
        sock.close()
        logging.getLogger("uvicorn.error").removeFilter(quiet)
    click.echo("edge0 serve: stopped", err=True)
