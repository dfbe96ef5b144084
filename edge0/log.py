"""structlog set-up: quiet human logs on stderr by default, JSON lines on request."""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

import structlog

_json_sink: IO[str] | None = None


def configure(level: str = "warning", json_file: str | None = None) -> None:
    """Configure structlog for the process.

    Args:
        level: minimum level shown on stderr ("debug", "info", "warning", ...).
        json_file: when set, every event (all levels) is also written there as
            one JSON object per line; "-" means stderr.
    """
    global _json_sink
    min_level = getattr(logging, level.upper(), logging.WARNING)
    if json_file is not None:
        _json_sink = sys.stderr if json_file == "-" else open(json_file, "a", buffering=1)  # noqa: SIM115
        renderer: Any = structlog.processors.JSONRenderer()
        logger_factory: Any = structlog.WriteLoggerFactory(file=_json_sink)
        min_level = logging.DEBUG
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
        logger_factory = structlog.WriteLoggerFactory(file=sys.stderr)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=logger_factory,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)


# Library use without the CLI: warnings and errors on stderr, nothing on stdout.
if not structlog.is_configured():
    configure()
