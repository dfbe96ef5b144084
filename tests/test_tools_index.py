"""tools/README.md names every tool, and every one-off script in docs/benchmarks/scripts/ is
listed in its README and cited by a page of the docs; no tool imports `edge0.cli` but its
entry point."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
SCRIPTS = ROOT / "docs" / "benchmarks" / "scripts"
SOURCES = (".py", ".sh", ".cpp")


def files(folder: Path) -> set[str]:
    """The scripts under `folder`, as paths relative to it."""
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.suffix in SOURCES and "__pycache__" not in p.parts
    }


def listed(readme: Path) -> set[str]:
    """The names in the first column of the README's tables (`name`, or `a`, `b`)."""
    out: set[str] = set()
    for line in readme.read_text().splitlines():
        cell = line.split("|")[1] if line.startswith("|") else ""
        out |= set(re.findall(r"`([^`]+)`", cell))
    return out


def test_tools_readme_names_every_tool() -> None:
    here, named = files(TOOLS), listed(TOOLS / "README.md")
    assert here - named == set(), f"tools without a line in tools/README.md: {here - named}"
    assert named - here == set(), f"tools/README.md names missing tools: {named - here}"


def test_one_off_scripts_are_listed_and_cited() -> None:
    here, named = files(SCRIPTS), listed(SCRIPTS / "README.md")
    assert here == named, f"docs/benchmarks/scripts/README.md differs: {here ^ named}"
    pages = [p for p in (ROOT / "docs").rglob("*.md") if SCRIPTS not in p.parents]
    text = "\n".join(p.read_text() for p in [*pages, ROOT / "README.md"])
    uncited = {
        name
        for name in here
        if f"docs/benchmarks/scripts/{name}" not in text and name != "memory_cmp.py"
    }  # memory_cmp.py is run by memory_cmp.sh, which docs/memory.md cites
    assert not uncited, f"one-off scripts no page cites: {uncited}"


def test_tools_import_no_private_cli_helpers() -> None:
    """A tool needs the library, not the CLI's helpers: only `edge0.cli.main`'s `main` (the
    `edge0` command itself) may be imported."""
    bad = []
    for folder in (TOOLS, SCRIPTS):
        for p in folder.rglob("*.py"):
            for m in re.finditer(
                r"(?:from|import) (edge0\.cli[\w.]*)(?: import (\w+))?", p.read_text()
            ):
                if m.groups() != ("edge0.cli.main", "main"):
                    bad.append(f"{p.relative_to(ROOT)}: {m.group(0)}")
    assert not bad, "tools importing edge0.cli:\n" + "\n".join(bad)
