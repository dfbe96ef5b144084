"""The click options of `run`, `serve` and `bench`, derived from the declared options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import click

from edge0.errors import ConfigError
from edge0.options.declare import Opt, check_value, declared, label
from edge0.options.engine import EngineOptions
from edge0.options.sampling import SamplingSettings

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class Renamed(click.Option):
    """An option whose later names are old spellings: still accepted, left out of --help."""

    def __init__(self, *args: Any, old: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.old = old

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        names = self.opts
        self.opts = [n for n in names if n not in self.old]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = names


def renamed(name: str, *old: str, dest: str, **kw: Any) -> Callable[[Any], Any]:
    """click.option(`name`, with `old` spellings kept as hidden aliases for a release)."""
    return click.option(name, *old, dest, cls=Renamed, old=old, **kw)


def _checker(name: str, o: Opt, many: bool) -> Callable[..., Any]:
    """A click callback: the declaration's own check, in the API's words."""

    def one(text: str) -> Any:
        if o.choices is not None or o.kind is str or (o.auto and text == "auto"):
            return text
        try:
            return o.kind(text)
        except ValueError:
            want = "an integer" if o.kind is int else "a number"
            want += " or 'auto'" if o.auto else ""
            raise ConfigError(f"{label(name, o)} takes {want}, not {text!r}") from None

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if many:
            values = [one(t.strip()) for t in value.split(",") if t.strip()]
        else:
            value = one(value) if o.auto and isinstance(value, str) else value
            values = [value]
        for v in values:
            check_value(name, o, v)  # a ConfigError: the CLI's one-line error, exit code 2
        if len(set(values)) != len(values):
            raise ConfigError(f"{label(name, o)} values must be distinct, got {value!r}")
        return (values or [None]) if many else value

    return check


def _flag(a: attrs.Attribute[Any], o: Opt, command: str) -> Decorator:
    """The click option of one declared option in `command`."""
    assert o.flag is not None
    default = o.default_for(command, a.default)
    many, repeated = command in o.lists, command in o.repeats
    text = o.help
    if many:
        text = f"{text} Comma-separated values compare one variant each."
    if o.default_help and default in (None, ""):
        text = f"{text} [default: {o.default_help}]"
    kw: dict[str, Any] = {"help": text, "show_default": default not in (None, "")}
    dest = o.cli_name(a.name)
    if o.kind is bool:
        return click.option(f"{o.flag}/--no-{o.flag[2:]}", dest, default=default, **kw)
    if repeated:
        return click.option(o.flag, dest, multiple=True, metavar="SPEC", **kw)
    if many:
        kw.update(default="" if default is None else default, type=str)
    elif o.choices is not None:
        kw.update(default=default, type=click.Choice(o.cli_choices or o.choices))
    else:
        kind = str if o.auto else {int: click.INT, float: click.FLOAT}.get(o.kind, str)
        kw.update(default=default, type=kind)
    kw["callback"] = _checker(a.name, o, many)
    old = o.old if command in ("bench", "sweep") else ()
    if old:
        return renamed(o.flag, *old, dest=dest, **kw)
    return click.option(o.flag, dest, **kw)


def flags(cls: type, command: str) -> Decorator:
    """Every declared option of `cls` that `command` takes, as click options, in order."""
    chosen = [(a, o) for a, o in declared(cls) if command in o.commands and o.flag]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for a, o in reversed(chosen):
            fn = _flag(a, o, command)(fn)
        return fn

    return decorate


def engine_options(command: str) -> Decorator:
    """The engine options of `command` (`run`, `serve`, `bench`, `sweep`)."""
    return flags(EngineOptions, command)


def sampling_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The sampler's settings, for the commands that generate."""
    return flags(SamplingSettings, "run")(fn)


def take(cls: type, command: str, kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the options of `cls` that `command` takes out of click's keyword arguments; return
    those given a value (None leaves the declared default to apply)."""
    names = {
        a.name: o.cli_name(a.name) for a, o in declared(cls) if command in o.commands and o.flag
    }
    given = {field: kw.pop(dest) for field, dest in names.items()}
    return {n: v for n, v in given.items() if v is not None}


def log_json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--log-json FILE: every structlog event of the run as JSON lines."""
    return click.option(
        "--log-json",
        "run_log_json",
        type=click.Path(dir_okay=False),
        default=None,
        help="Keep every structlog event (reads, compute spans) as JSON lines in this file.",
    )(fn)


def stats_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--stats line|full and -v (= --stats full): how much `edge0 run` reports on stderr."""
    fn = click.option("-v", "--verbose", is_flag=True, help="The same as --stats full.")(fn)
    return click.option(
        "--stats",
        type=click.Choice(["line", "full"]),
        default="line",
        show_default=True,
        help="Statistics on stderr after the text: one line (tok/s, memory, MiB read per "
        "token, blocked ms per step) or the full report (mode, compute, host syncs, "
        "overlap, prefill, hit rates, tickets, event-loop lag).",
    )(fn)
