"""`edge0 serve`'s limit flags (docs/server.md, "Limits"): connections, timeouts, queue."""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any

import click

from edge0.errors import ConfigError
from edge0.server import limits as defaults
from edge0.server.limits import Limits

FD_MARGIN = 256  # files the server keeps open besides its connections (model, tiers, logs)
_SECONDS = click.FloatRange(0.1, 3600.0)
KEYS = (
    "max_connections",
    "header_timeout",
    "body_timeout",
    "keep_alive",
    "max_header",
    "max_queue",
)


def limit_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The limit flags, in the order of the docs' table."""
    options = [
        click.option(
            "--max-connections",
            default=defaults.MAX_CONNECTIONS,
            show_default=True,
            type=click.IntRange(1, 1 << 20),
            help="Open connections; one more is answered 503 (Retry-After) and closed.",
        ),
        click.option(
            "--header-timeout",
            default=defaults.HEADER_TIMEOUT_S,
            show_default=True,
            type=_SECONDS,
            help="Seconds for a request's line and headers to arrive; then 408 and closed.",
        ),
        click.option(
            "--body-timeout",
            default=defaults.BODY_TIMEOUT_S,
            show_default=True,
            type=_SECONDS,
            help="Seconds for a whole request body to arrive; then 408 and closed.",
        ),
        click.option(
            "--keep-alive",
            default=defaults.KEEP_ALIVE_S,
            show_default=True,
            type=click.IntRange(1, 3600),
            help="Seconds an idle connection stays open between requests.",
        ),
        click.option(
            "--max-header-size",
            "max_header",
            default="16KiB",
            show_default=True,
            help="Largest request line and headers; more is a 400.",
        ),
        click.option(
            "--max-queue",
            default=defaults.MAX_QUEUE,
            show_default=True,
            type=click.IntRange(0, 1 << 20),
            help="Requests waiting for the engine beyond --max-batch; one more is answered "
            "429 (Anthropic: 529) with Retry-After.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def take_limits(kw: dict[str, Any]) -> Limits:
    """The Limits of the flags (popped from `kw`), checked before any work."""
    from edge0.storage.spec import parse_size

    values = {k: kw.pop(k) for k in KEYS}
    try:
        values["max_header"] = parse_size(values["max_header"])
    except ValueError as exc:
        raise ConfigError(f"--max-header-size: {exc}") from None
    if not 1 << 10 <= values["max_header"] <= 1 << 20:
        raise ConfigError(f"--max-header-size is {values['max_header']} bytes; give 1KiB to 1MiB")
    limits = Limits(**values)
    files_for(limits.max_connections)
    return limits


def files_for(connections: int) -> None:
    """Raise the open-file limit to hold `connections` sockets plus FD_MARGIN, as far as the
    hard limit allows; a ConfigError when it cannot."""
    need = connections + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ConfigError(
            f"--max-connections {connections} needs {need} open files, but this process may "
            f"open at most {hard} (`ulimit -Hn`); lower --max-connections to "
            f"{max(1, hard - FD_MARGIN)} or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
