"""The repository speaks of itself alone: no machine paths, no files outside it, no dead links.

Docs, tools, tiers, examples and the package are grepped (tracked files only) for
absolute paths of the machine they were written on and for files that are not in
the repository; every relative link in the markdown must reach a tracked file.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHERE = ["docs", "tools", "tiers", "edge0", "examples", "README.md", "Makefile", "pyproject.toml"]
# what only exists on one machine: scratch and home directories, temp files, notes kept
# outside the repository, and other work that happened to share the machine
FORBIDDEN = {
    "an absolute path under /work": re.compile(r"(?<![\w.~-])/work/"),
    "a temp-directory path": re.compile(r"(?<![\w.~-])/tmp/"),
    "a home directory": re.compile(r"(?<![\w.~-])/(home|root|Users)/\w"),
    "a scratch directory": re.compile(r"(?<![\w.-])/scratch\b"),
    "a notes file outside the repository": re.compile(r"\bFACTS\.md\b"),
    "other work on the machine (say 'load average N')": re.compile(
        r"\bother (helpers|sessions|engineers|agents)\b|\bhelpers' |\bsessions' ", re.I
    ),
}
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _tracked(binary: bool = False) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *WHERE], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    skip = set() if binary else {".png", ".safetensors", ".bin", ".zst"}
    return [ROOT / p for p in out.split("\0") if p and Path(p).suffix not in skip]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError):
        return ""


def test_files_name_no_machine_paths_or_outside_files() -> None:
    found = []
    for path in _tracked():
        if path.name == "tokenizer.json":  # the demo's vocabulary: words, not references
            continue
        for n, line in enumerate(_text(path).splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {what}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "see /work/scratch/medium",
        "FACTS.md says",
        "cp /tmp/x .",
        "shared with other sessions",
        "ls /home/alice",
    ],
)
def test_the_patterns_catch_what_they_name(line: str) -> None:
    assert any(p.search(line) for p in FORBIDDEN.values())


def test_relative_links_in_the_docs_reach_tracked_files() -> None:
    tracked = {p.resolve() for p in _tracked(binary=True)}
    dead = []
    for path in [p for p in _tracked() if p.suffix == ".md"]:
        for target in LINK.findall(_text(path)):
            if re.match(r"[a-z]+:|#", target):
                continue  # a URL or an anchor in the same page
            dest = (path.parent / target.split("#")[0]).resolve()
            if dest not in tracked and not dest.is_dir():
                dead.append(f"{path.relative_to(ROOT)}: ({target})")
    assert not dead, "\n".join(dead)
