"""Options as data: each option declared once, and run, serve, bench and Engine.open agree."""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path
from typing import Any

import attrs
import click
import pytest
from click.testing import CliRunner

from edge0.cli.bench_run import run_cmd as bench_run_cmd
from edge0.cli.bench_run import sweep_cmd
from edge0.cli.main import main
from edge0.cli.run import command as run_cmd
from edge0.cli.serve import command as serve_cmd
from edge0.cli.tune import command as tune_cmd
from edge0.errors import ConfigError
from edge0.options.declare import COMMANDS, Opt, declared
from edge0.options.engine import EngineOptions
from edge0.options.sampling import SamplingSettings
from edge0.runtime.engine.api import Engine

ROOT = Path(__file__).resolve().parents[1]
CLICK = {
    "run": run_cmd,
    "serve": serve_cmd,
    "bench": bench_run_cmd,
    "sweep": sweep_cmd,
    "tune": tune_cmd,
}
EVERY = [(cls, a, o) for cls in (EngineOptions, SamplingSettings) for a, o in declared(cls)]
FLAGGED = [(cls, a, o) for cls, a, o in EVERY if o.flag]


def _params(command: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in command.params if p.name}


# the modules that build `run`, `serve`, `bench run`/`sweep` and Engine.open (the other
# commands, such as `train` or `eval`, have flags of their own with other meanings)
DERIVED = [
    "options/*.py",
    "cli/run.py",
    "cli/serve.py",
    "cli/stream.py",
    "cli/bench_run.py",
    "cli/checks.py",
    "cli/options.py",
    "cli/dist_flags.py",
    "cli/tune.py",
    "runtime/engine/*.py",
    "runtime/setup/*.py",
]


def _sources() -> str:
    files = sorted({f for pattern in DERIVED for f in (ROOT / "edge0").glob(pattern)})
    return "\n".join(f.read_text() for f in files)


@pytest.mark.parametrize("cls,a,o", FLAGGED, ids=[a.name for _, a, _ in FLAGGED])
def test_each_flag_is_declared_in_one_place(cls: type, a: attrs.Attribute[Any], o: Opt) -> None:
    """The flag's string appears once in the source of the commands that take it and of
    Engine.open: in its declaration."""
    assert o.flag is not None
    places = re.findall(rf'"{re.escape(o.flag)}"', _sources())
    assert len(places) == 1, f"{o.flag} is written {len(places)} times"


@pytest.mark.parametrize("cls,a,o", FLAGGED, ids=[a.name for _, a, _ in FLAGGED])
def test_commands_take_the_declared_option(cls: type, a: attrs.Attribute[Any], o: Opt) -> None:
    """Each command that the declaration names has the flag, with its help; no other has."""
    for name, command in CLICK.items():
        param = _params(command).get(o.cli_name(a.name))
        if name not in o.commands:
            assert param is None, (name, a.name)
            continue
        assert isinstance(param, click.Option), (name, a.name)
        assert o.flag in param.opts
        assert param.help is not None and param.help.startswith(o.help)
        many = name in o.lists or name in o.repeats
        default = o.default_for(name, a.default)
        if not many and default is not None:
            assert param.default == default, (name, a.name)
        if o.choices is not None and not many:
            assert isinstance(param.type, click.Choice)
            assert set(param.type.choices) == set(o.cli_choices or o.choices)


def test_engine_open_takes_every_engine_option() -> None:
    """Engine.open's signature is the declaration's: every field, by name, with its default."""
    sig = inspect.signature(Engine.open)
    fields = {a.name: a.default for a in attrs.fields(EngineOptions)}
    params = {n: p.default for n, p in sig.parameters.items() if n != "path"}
    assert params == fields
    for _, a, _ in [e for e in EVERY if e[0] is EngineOptions]:
        assert f"{a.name}=" in (Engine.open.__doc__ or "")


def _bad_values(o: Opt) -> list[Any]:
    if o.choices is not None:
        return ["no-such-value"]
    out: list[Any] = []
    if o.low is not None:
        out.append(o.low - 1 if o.kind is int else o.low - 0.5)
    if o.high is not None:
        out.append(o.high + 1)
    if o.kind is float:
        out.append(math.nan)
    return out


CHECKED = [(cls, a, o) for cls, a, o in EVERY if _bad_values(o)]


@pytest.mark.parametrize("cls,a,o", CHECKED, ids=[a.name for _, a, _ in CHECKED])
def test_bad_values_are_refused_by_the_api_and_the_cli(
    cls: type, a: attrs.Attribute[Any], o: Opt
) -> None:
    """The declaration's range and choices hold for the API and for every command's flag."""
    for bad in _bad_values(o):
        with pytest.raises(ConfigError, match=re.escape(a.name.replace("_", " ")) + "|" + a.name):
            obj = cls(**{a.name: bad})
            if cls is EngineOptions:
                obj.check()
        for name in o.commands:
            if name in o.repeats:
                continue
            args = _args(name) + [str(o.flag), str(bad)]
            res = CliRunner().invoke(main, args)
            assert res.exit_code == 2, (name, bad, res.output)
            assert str(o.flag) in res.output or a.name in res.output


def _args(command: str) -> list[str]:
    model = str(ROOT / "edge0" / "data" / "teacher")
    return {
        "run": ["run", "-p", "x"],
        "serve": ["serve"],
        "bench": ["bench", "run", model],
        "sweep": ["bench", "sweep", model],
        "tune": ["tune", model],
    }[command]


def test_bench_lists_are_checked_value_by_value() -> None:
    res = CliRunner().invoke(main, ["bench", "run", "x", "--top-k", "2,0"])
    assert res.exit_code == 2 and "--top-k (top_k=) must be at least 1, got 0" in res.output
    res = CliRunner().invoke(main, ["bench", "run", "x", "--modes", "route,fast"])
    assert res.exit_code == 2 and "unknown mode 'fast'" in res.output


def test_every_declared_command_exists() -> None:
    for _, _, o in EVERY:
        assert set(o.commands) <= set(COMMANDS)
        assert set(o.lists) <= set(o.commands) and set(o.repeats) <= set(o.commands)
