"""The figures of README.md and docs/benchmarks/index.md, checked against the committed results.

A figure in prose is followed by a marker naming where it comes from:

    route 5.00 tok/s<!-- fig modes.json: r.variants.find(mode="route").median.decode_tps -->

`fig FILE: EXPR; EXPR; ...` takes the numbers of the text since the previous marker (or the
start of the table cell or paragraph), one expression each, in order. An expression is Python
over `r` (FILE, a JSON file of docs/benchmarks/results/, as a `Node`), `R(NAME)` (another
result file), `min`, `max`, `median`, `range`, `zip`, `grab(NODE, REGEX)` (a number in a
printed line the result kept) and `upper(X)` / `lower(X)` (a figure written as a bound, "under
0.15 ms": X must not pass it); `_` says the number is a stated condition, not a result.
The written number must be the expression's value rounded to the decimals it shows.
Numbers inside code spans, link targets and words that start with a letter (`qwen3.5`, `K=4`,
`A3B`) are names, not figures; `35B` (a number glued to a word that is no unit) too.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "benchmarks" / "results"
MARKER = re.compile(r"<!--\s*fig\s+([^:\s]+)\s*:(.*?)-->", re.S)
UNITS = {"x", "s", "ms", "us", "min", "h", "MiB", "GiB", "KiB", "MB", "GB", "KB", "M", "k", "%"}
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


class FigureError(ValueError):
    """A figure that its result does not back."""


@attrs.frozen
class Node:
    """A value of a result file, with where it sits (for error messages)."""

    value: Any
    where: str

    def __getattr__(self, key: str) -> Node:
        if key.startswith("__"):
            raise AttributeError(key)
        return self[key]

    def __getitem__(self, key: int | str) -> Node:
        try:
            return Node(self.value[key], f"{self.where}[{key!r}]")
        except (KeyError, IndexError, TypeError) as exc:
            raise FigureError(f"{self.where} has no [{key!r}]") from exc

    def _matches(self, conds: dict[str, Any], exact: bool) -> list[Node]:
        if not isinstance(self.value, list):
            raise FigureError(f"{self.where} is not a list")
        out = []
        for i, item in enumerate(self.value):
            if not isinstance(item, dict):
                continue
            if all(_same(item.get(k), v, exact) for k, v in conds.items()):
                out.append(Node(item, f"{self.where}[{i}]"))
        return out

    def find(self, **conds: Any) -> Node:
        """The one element of a list of objects whose fields equal `conds`."""
        return _one(self._matches(conds, True), self.where, conds)

    def match(self, **conds: Any) -> Node:
        """The one element whose string fields contain `conds` (others: equal)."""
        return _one(self._matches(conds, False), self.where, conds)

    def variant(self, **conds: Any) -> Node:
        """`edge0 bench run`'s variant whose fields equal `conds` (mode, k, kernels, ...)."""
        return self.variants.find(**conds)

    def run(self, i: int) -> Node:
        """Round `i`'s summary of a bench variant."""
        return self.runs[i].summary

    def all(self, **conds: Any) -> list[Node]:
        """Every element of a list of objects whose fields contain `conds`."""
        return self._matches(conds, False)

    def __iter__(self) -> Iterator[Node]:
        if not isinstance(self.value, list):
            raise FigureError(f"{self.where} is not a list")
        return (Node(v, f"{self.where}[{i}]") for i, v in enumerate(self.value))

    def __float__(self) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise FigureError(f"{self.where} is {self.value!r}, not a number")
        return float(self.value)

    def _num(self, other: Any) -> tuple[float, float]:
        return float(self), float(other)

    def __truediv__(self, other: Any) -> float:
        a, b = self._num(other)
        return a / b

    def __rtruediv__(self, other: Any) -> float:
        a, b = self._num(other)
        return b / a

    def __mul__(self, other: Any) -> float:
        a, b = self._num(other)
        return a * b

    __rmul__ = __mul__

    def __add__(self, other: Any) -> float:
        a, b = self._num(other)
        return a + b

    __radd__ = __add__

    def __sub__(self, other: Any) -> float:
        a, b = self._num(other)
        return a - b

    def __rsub__(self, other: Any) -> float:
        a, b = self._num(other)
        return b - a

    def __lt__(self, other: Any) -> bool:
        a, b = self._num(other)
        return a < b

    def __gt__(self, other: Any) -> bool:
        a, b = self._num(other)
        return a > b


def _same(have: Any, want: Any, exact: bool) -> bool:
    if not exact and isinstance(have, str) and isinstance(want, str):
        return want in have
    return bool(have == want)


def _one(found: list[Node], where: str, conds: dict[str, Any]) -> Node:
    if len(found) != 1:
        raise FigureError(f"{where}: {len(found)} elements match {conds}, not one")
    return found[0]


@cache
def result(name: str) -> Node:
    """A result file of docs/benchmarks/results/ (a JSON document)."""
    path = RESULTS / name
    if not path.is_file():
        raise FigureError(f"no result file docs/benchmarks/results/{name}")
    return Node(json.loads(path.read_text()), name)


def _median(values: Any) -> float:
    return statistics.median(float(v) for v in values)


def _grab(node: Node, pattern: str) -> float:
    """The number that `pattern`'s first group finds in a string (or the first of a list of
    strings that it matches): results that kept a command's printed lines."""
    lines = node.value if isinstance(node.value, list) else [node.value]
    for line in lines:
        if isinstance(line, str) and (m := re.search(pattern, line)):
            return float(m.group(1).replace(",", ""))
    raise FigureError(f"{node.where}: nothing matches {pattern!r}")


@attrs.frozen
class Bound:
    """A figure written as a bound ("under 0.15 ms"): the value must not pass it."""

    value: float
    upper: bool


def _upper(value: Any) -> Bound:
    return Bound(float(value), True)


def _lower(value: Any) -> Bound:
    return Bound(float(value), False)


SCOPE = {
    "R": None,  # set below: result
    "min": min,
    "max": max,
    "median": _median,
    "range": range,
    "zip": zip,
    "grab": _grab,
    "upper": _upper,
    "lower": _lower,
}


def evaluate(name: str, expr: str) -> float | Bound:
    """The value of one marker expression over the result file `name`."""
    scope = {**SCOPE, "R": result, "r": result(name)}
    try:  # our own docs' expressions; globals, so that a comprehension sees `r`
        value = eval(f"({expr})", {"__builtins__": {}, **scope})  # (): an expression may wrap
    except FigureError:
        raise
    except Exception as exc:
        raise FigureError(f"{name}: {expr}: {type(exc).__name__}: {exc}") from exc
    return value if isinstance(value, Bound) else float(value)


@attrs.frozen
class Figure:
    """A number as written in the text."""

    text: str

    @property
    def value(self) -> float:
        return float(self.text.replace(",", ""))

    @property
    def decimals(self) -> int:
        return len(self.text.partition(".")[2])

    def backed_by(self, value: float) -> bool:
        """Whether the written number is `value` rounded to the decimals it shows."""
        return abs(value - self.value) <= 0.5 * 10**-self.decimals * (1 + 1e-9)


def _plain(text: str) -> str:
    """The text without code spans, link targets and emphasis marks."""
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return text.replace("*", "")


def figures(text: str) -> list[Figure]:
    """The figures of a stretch of prose: numbers outside names, code spans and links."""
    out = []
    for word in re.split(r"(?:[\s();:\[\]/|]|,(?!\d{3}))+", _plain(text)):
        word = word.lstrip("+-~")  # +0.0001, ~19
        if not word or not word[0].isdigit():
            continue
        for m in NUMBER.finditer(word):
            tail = re.match(r"[A-Za-z%]+", word[m.end() :])
            if tail and tail.group(0) not in UNITS:
                continue  # `35B`, `1st`: a name
            if m.start() and word[m.start() - 1].isalpha():
                continue
            out.append(Figure(m.group(0)))
    return out


@attrs.frozen
class Check:
    """One number and the expression that backs it (`_`: a stated condition)."""

    figure: Figure
    source: str
    expr: str


def checks(segment: str, where: str) -> Iterator[Check]:
    """Each figure of a segment paired with its marker's expression; a figure no marker covers,
    or a marker whose expressions do not match the figures before it, raises FigureError."""
    start = 0
    for m in MARKER.finditer(segment):
        if "--" in m.group(0)[4:-3]:  # GitHub's markdown would show such a comment as text
            raise FigureError(f"{where}: a marker may not contain '--': {m.group(0)[:60]}")
        found = figures(segment[start : m.start()])
        exprs = [e.strip() for e in m.group(2).split(";") if e.strip()]
        if len(exprs) != len(found):
            shown = ", ".join(f.text for f in found) or "none"
            raise FigureError(
                f"{where}: the marker for {m.group(1)} has {len(exprs)} expressions for "
                f"{len(found)} figures ({shown})"
            )
        yield from (Check(f, m.group(1), e) for f, e in zip(found, exprs, strict=True))
        start = m.end()
    rest = figures(segment[start:])
    if rest:
        shown = ", ".join(f.text for f in rest)
        raise FigureError(f"{where}: figures without a result marker: {shown}")


def verify(check: Check) -> str | None:
    """None when the result backs the figure, else what is wrong."""
    if check.expr == "_":
        return None
    try:
        value = evaluate(check.source, check.expr)
    except FigureError as exc:
        return str(exc)
    if isinstance(value, Bound):
        passed = (
            value.value > check.figure.value if value.upper else value.value < check.figure.value
        )
        if not passed:
            return None
        side = "above" if value.upper else "below"
        return f"{value.value:.6g} is {side} {check.figure.text} ({check.source}: {check.expr})"
    if check.figure.backed_by(value):
        return None
    return f"{check.figure.text} is not {value:.6g} ({check.source}: {check.expr})"


def table_cells(text: str, column: int) -> Iterator[tuple[int, str]]:
    """(line number, the cell) of a column in the rows of the markdown tables (no headers)."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = re.split(r"(?<!\\)\|(?![^<]*-->)", line)[1:-1]
        if len(cells) > column:
            yield n, cells[column]


def paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each paragraph, and of each table row on its own."""
    block: list[str] = []
    first = 0
    for n, line in enumerate([*text.splitlines(), ""], 1):
        if line.startswith("|"):
            if block:
                yield first, "\n".join(block)
                block = []
            yield n, line
        elif line.strip():
            if not block:
                first = n
            block.append(line)
        elif block:
            yield first, "\n".join(block)
            block = []
