"""The import graph of edge0/ and tiers/: no cycles, and the layering rule of docs/architecture.md.

The graph is built from the source files with `ast` (nothing is imported): every
`import` and `from ... import` statement, at module level, inside a function or under
`if TYPE_CHECKING:` (a type-only import is a dependency too: where a type must be named
across packages, the lower one declares a Protocol of what it uses).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("edge0", "tiers")
RULE_DOC = ROOT / "docs" / "architecture.md"


def modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under the packages."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement: at module level, in functions, under `if TYPE_CHECKING:`."""
    for child in ast.walk(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of our modules (None: a third-party import)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (type-only imports included)."""
    known = modules(root, packages)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for stmt in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(stmt, ast.Import):
                wanted = [alias.name for alias in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:  # relative: from the importing module's package upwards
                    up = package.split(".")[: len(package.split(".")) - stmt.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from pkg import mod` imports the module pkg.mod
                wanted = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in stmt.names
                ]
            targets |= {t for w in wanted if (t := _known(w, known)) and t != name}
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def read_rule(doc: Path = RULE_DOC) -> list[list[str]]:
    """The layers of the rule, top first: the lines of the ```layers block in the doc."""
    match = re.search(r"```layers\n(.*?)```", doc.read_text(), re.S)
    assert match, f"{doc} has no ```layers block (the layering rule this test checks)"
    return [
        line.split("#")[0].split()
        for line in match.group(1).splitlines()
        if line.split("#")[0].strip()
    ]


def unit_of(module: str, units: Iterable[str]) -> str | None:
    """The rule's entry a module belongs to: the longest entry that is it or a package above it
    (the entry `edge0` is edge0/__init__.py alone: every other module has its own entry)."""
    best = None
    for unit in units:
        below = unit != "edge0" and module.startswith(unit + ".")
        if (module == unit or below) and len(unit) > len(best or ""):
            best = unit
    return best


def violations(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Imports that break the rule: a unit may import only itself and units on lower lines."""
    level = {unit: i for i, line in enumerate(layers) for unit in line}
    out = []
    for module in sorted(graph):
        src = unit_of(module, level)
        for target in sorted(graph[module]):
            dst = unit_of(target, level)
            if src is None or dst is None or src == dst:
                continue
            if level[dst] <= level[src]:
                where = "the same line" if level[dst] == level[src] else "a higher line"
                out.append(f"{module} imports {target}: {dst} is on {where} than {src}")
    return out


# --- the checks ---------------------------------------------------------------------------


def test_no_import_cycles() -> None:
    found = cycles(import_graph(ROOT))
    shown = "\n".join(" <-> ".join(c) for c in found)
    assert not found, f"import cycles (name a type of a module above through a Protocol):\n{shown}"


def test_every_module_has_a_place_in_the_rule() -> None:
    units = [u for line in read_rule() for u in line]
    assert len(units) == len(set(units)), "an entry appears twice in the layering rule"
    known = modules(ROOT)
    missing = [u for u in units if u not in known]
    assert not missing, f"the layering rule names no such module or package: {missing}"
    homeless = [m for m in sorted(known) if unit_of(m, units) is None]
    assert not homeless, f"modules outside every entry of the layering rule: {homeless}"


def test_dependencies_point_down_the_layers() -> None:
    bad = violations(import_graph(ROOT), read_rule())
    assert not bad, "imports against docs/architecture.md's layering rule:\n" + "\n".join(bad)


# --- the checker itself, on small trees ---------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_cycles_type_only_ones_too(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import f\n",
            "pkg/b.py": "def f():\n    from pkg import c\n",  # a function-level import counts
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import x\n",
            "pkg/e.py": "from . import d\nimport os\n",
        },
    )
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.d"] == {"pkg.a"} and graph["pkg.e"] == {"pkg.d"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    (tmp_path / "pkg/c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
    )
    assert cycles(import_graph(tmp_path, ["pkg"])) == [["pkg.a", "pkg.b", "pkg.c"]]
    (tmp_path / "pkg/c.py").write_text("")
    assert cycles(import_graph(tmp_path, ["pkg"])) == []


@pytest.mark.parametrize(
    ("importer", "imported", "broken"),
    [
        ("top.x", "low.y", False),  # down
        ("low.y", "top.x", True),  # up
        ("mid.z", "mid.w", False),  # inside one entry
        ("mid.z", "peer.v", True),  # a peer on the same line
        ("low.y", "low.sub.u", False),  # the longest entry wins: low.sub is lower than low
        ("low.sub.u", "low.y", True),
    ],
)
def test_checker_layers(importer: str, imported: str, broken: bool) -> None:
    layers = [["top"], ["mid", "peer"], ["low"], ["low.sub"]]
    assert bool(violations({importer: {imported}, imported: set()}, layers)) is broken
