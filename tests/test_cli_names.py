"""One option name per idea across the `edge0` commands; old spellings still parse, unlisted."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from edge0.cli.main import main
from edge0.cli.options import Renamed

# old spelling -> the one name every command now uses for that idea
OLD = {"--k": "--top-k", "--temperature": "--temp", "--markdown": "--md"}


def _commands(
    group: click.Command = main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, group
    if isinstance(group, click.Group):
        for name, cmd in group.commands.items():
            yield from _commands(cmd, (*path, name))


def _help(path: tuple[str, ...]) -> str:
    res = CliRunner().invoke(main, [*path, "--help"])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("path", [p for p, _ in _commands() if p], ids=" ".join)
def test_help_lists_only_the_current_names(path: tuple[str, ...]) -> None:
    text = _help(path)
    for old in OLD:
        assert f"{old} " not in text and f"{old}," not in text, f"edge0 {' '.join(path)}: {old}"


def test_old_spellings_are_hidden_aliases_of_the_new_names() -> None:
    seen = set()
    for path, cmd in _commands():
        for param in cmd.params:
            names = set(getattr(param, "opts", []))
            for old, new in OLD.items():
                if old in names:
                    assert isinstance(param, Renamed) and new in names, (path, param.name)
                    assert old in param.old and param.opts[0] == new
                    seen.add(old)
    assert seen == set(OLD)  # each old spelling is still accepted somewhere


def test_an_old_spelling_parses_to_the_same_value() -> None:
    cmd = main.commands["bench"].commands["batch"]  # type: ignore[attr-defined]
    old = cmd.make_context("batch", ["--k", "3", "."], resilient_parsing=True)
    new = cmd.make_context("batch", ["--top-k", "3", "."], resilient_parsing=True)
    assert old.params["k"] == new.params["k"] == 3
