"""Every figure of docs/benchmarks/index.md's headlines and of README.md's benchmark figures is
checked against the committed result it came from (tests/figures.py has the marker rule), so a
figure that no result backs, or a result changed under its figure, fails here."""

from __future__ import annotations

import re

import pytest
from figures import ROOT, Check, FigureError, checks, figures, paragraphs, table_cells, verify

INDEX = ROOT / "docs" / "benchmarks" / "index.md"
README = ROOT / "README.md"
HEADLINE = 2  # docs/benchmarks/index.md's table: question | page | headline
README_CHECKED = ("Benchmarks",)  # README sections whose every figure is checked


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _unfenced(text: str) -> str:
    """The text with fenced code blocks blanked (their lines kept, for line numbers)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)


def index_checks() -> list[Check]:
    out: list[Check] = []
    for n, cell in table_cells(INDEX.read_text(), HEADLINE):
        out += checks(cell, f"docs/benchmarks/index.md:{n}")
    return out


def readme_checks() -> list[Check]:
    """Every paragraph of the checked sections, and every other paragraph with a marker."""
    text = _unfenced(README.read_text())
    checked = [_unfenced(_sections(text)[s]) for s in README_CHECKED]
    out: list[Check] = []
    for n, para in paragraphs(text):
        if "<!-- fig" in para or any(para in s for s in checked):
            out += checks(para, f"README.md:{n}")
    return out


def test_index_and_readme_figures_match_their_results() -> None:
    found = index_checks() + readme_checks()
    wrong = [f"{c.figure.text}: {why}" for c in found if (why := verify(c))]
    assert not wrong, "figures their results do not back:\n" + "\n".join(wrong)
    assert sum(c.expr != "_" for c in found) >= 100  # the markers are really read


def test_every_headline_has_figures_backed() -> None:
    cells = list(table_cells(INDEX.read_text(), HEADLINE))[1:]  # below the header row
    bare = [n for n, cell in cells if not figures(cell)]
    assert not bare, f"docs/benchmarks/index.md headlines without a figure: lines {bare}"


# --- the rule itself, on small texts ------------------------------------------------------

M = '<!-- fig modes.json: r.variants.find(mode="route").median.decode_tps -->'


def test_a_figure_is_its_value_rounded() -> None:
    (c,) = checks(f"route 5.00 tok/s{M}", "t")
    assert verify(c) is None
    (c,) = checks(f"route 5.01 tok/s{M}", "t")  # a stale figure
    assert "5.01 is not 5.00423" in (verify(c) or "")
    (c,) = checks(f"route 5 tok/s{M}", "t")  # fewer decimals, still the value
    assert verify(c) is None


def test_every_number_needs_its_marker() -> None:
    with pytest.raises(FigureError, match="without a result marker: 1.70"):
        list(checks(f"route 5.00 tok/s{M}, 1.70x reactive", "t"))
    with pytest.raises(FigureError, match="1 expressions for 2 figures"):
        list(checks(f"route 5.00 tok/s, 1.70x{M}", "t"))
    with pytest.raises(FigureError, match="may not contain '--'"):
        list(checks('1.0<!-- fig modes.json: r.x("--a") -->', "t"))
    found = list(checks(f"K=4, qwen3.5, `--top-k 8`, [a](x2.md), the 35B shape: 5.00x{M}", "t"))
    assert [c.figure.text for c in found] == ["5.00"]  # names, code and links are no figures


def test_conditions_and_missing_results() -> None:
    route = 'r.variants.find(mode="route").median.decode_tps'
    a, b = checks(f"2 ranks: 5.00 tok/s<!-- fig modes.json: _; {route} -->", "t")
    assert verify(a) is None and verify(b) is None
    (c,) = checks("1.0<!-- fig nothing.json: r.x -->", "t")
    assert "no result file" in (verify(c) or "")
    (c,) = checks('1.0<!-- fig modes.json: r.variants.find(mode="none").k -->', "t")
    assert "0 elements match" in (verify(c) or "")
