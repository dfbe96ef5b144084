"""`opt()`: an attrs field that also carries its flag, help, range and commands."""

from __future__ import annotations

import math
import textwrap
from typing import Any

import attrs

from edge0.errors import ConfigError

KEY = "edge0.option"  # where an option's declaration sits in its attrs field's metadata
# the commands that derive flags from the table
COMMANDS = ("run", "serve", "bench", "sweep", "tune")
# values click cannot check, checked by the CLI before any heavy import (edge0.cli.checks)
VALUE_KINDS = ("tiers", "size", "output-file")


@attrs.frozen
class Opt:
    """One option's declaration: everything the CLI, `Engine.open` and the checks need."""

    help: str
    kind: type = str  # int, float, str or bool (a bool is a --flag/--no-flag pair)
    flag: str | None = None  # the CLI flag; None: no flag (the API alone takes it)
    commands: tuple[str, ...] = ()  # the commands whose flags include it (COMMANDS)
    choices: tuple[str, ...] | None = None
    cli_choices: tuple[str, ...] | None = None  # a narrower set offered on the CLI
    low: float | None = None  # the smallest value allowed
    high: float | None = None  # the largest
    finite: bool = False  # a float that must be finite (otherwise inf is allowed, nan never)
    default_help: str | None = None  # "[default: ...]" when the default is worked out later
    defaults: dict[str, Any] = attrs.field(factory=dict)  # a command's own default
    value: str | None = None  # a VALUE_KINDS check for strings click cannot make
    # the benchmarks compare values: commands where the flag takes a comma list of them
    # (one variant each), or is repeated (for values that contain commas)
    lists: tuple[str, ...] = ()
    repeats: tuple[str, ...] = ()
    old: tuple[str, ...] = ()  # earlier spellings the benchmarks accept, left out of --help
    dest: str | None = None  # the CLI's name for it where the field's would clash
    auto: bool = False  # the word "auto" is a value too (worked out by measurement)

    def cli_name(self, field: str) -> str:
        return self.dest or field

    def default_for(self, command: str, default: Any) -> Any:
        return self.defaults.get(command, default)


def opt(default: Any, help: str, **kw: Any) -> Any:
    """An attrs field with `default`, declared as an option (keywords: `Opt`'s fields)."""
    return attrs.field(default=default, metadata={KEY: Opt(help=help, **kw)})


def declared(cls: type) -> list[tuple[attrs.Attribute[Any], Opt]]:
    """The fields of the attrs class `cls` that are declared options, in order."""
    return [(a, a.metadata[KEY]) for a in attrs.fields(cls) if KEY in a.metadata]


def label(name: str, o: Opt) -> str:
    """How an error names an option: its flag and its keyword, e.g. `--top-k (top_k=)`."""
    return f"{o.flag} ({name}=)" if o.flag else f"{name}="


def check_value(name: str, o: Opt, value: Any) -> None:
    """ConfigError unless `value` has the option's kind, is one of its choices and in range."""
    if value is None or (o.auto and value == "auto"):
        return  # None means "worked out later" wherever a declaration allows it
    if o.choices is not None:
        if value not in o.choices:
            raise ConfigError(
                f"unknown {name.replace('_', ' ')} {value!r} ({label(name, o)}); choose one of "
                f"{', '.join(o.choices)}"
            )
        return
    if o.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        also = " or 'auto'" if o.auto else ""
        raise ConfigError(f"{label(name, o)} must be an integer{also}, got {value!r}")
    if o.kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{label(name, o)} must be a number, got {value!r}")
        if math.isnan(value) or (math.isinf(value) and (o.finite or o.high is not None)):
            raise ConfigError(f"{label(name, o)} must be a finite number, got {value!r}")
    if o.low is not None and o.high is not None and not o.low <= value <= o.high:
        raise ConfigError(f"{label(name, o)} must be between {o.low:g} and {o.high:g}, got {value}")
    if o.low is not None and value < o.low:
        raise ConfigError(f"{label(name, o)} must be at least {o.low:g}, got {value}")


def check_declared(obj: Any) -> None:
    """Every declared option of the attrs instance `obj` checked against its declaration."""
    for a, o in declared(type(obj)):
        check_value(a.name, o, getattr(obj, a.name))


def signature_doc(cls: type, indent: str = "        ") -> str:
    """One entry per option of `cls` (name=default: help), for a generated docstring."""
    lines = []
    for a, o in declared(cls):
        text = f"{a.name}={a.default!r}: {o.help}"
        if a.default is None and o.default_help:
            text += f" [None: {o.default_help}]"
        lines += textwrap.wrap(text, 92, initial_indent=indent, subsequent_indent=indent + "  ")
    return "\n".join(lines)
