"""The family-agnostic packages name no family: they ask the family (edge0/families/).

Everything specific to one model family lives in its module under edge0/families/; the
runtime, the expert store and its tiers, the checkpoint format, the prerouter, training,
evaluation, several machines, the server, hub ids and the options go through the `Family`
it answers for a config or a loaded model. A family name in them (a model_type, or its
hyphenated form, in code, a comment or a docstring) is either a per-family rule in the
wrong place or a comment that will go stale.
"""

from __future__ import annotations

import re
from pathlib import Path

from edge0.families import FAMILIES, every_family

ROOT = Path(__file__).resolve().parent.parent
AGNOSTIC = (
    "edge0/runtime",
    "edge0/storage",
    "edge0/layout",
    "edge0/routing",
    "edge0/train",
    "edge0/eval",
    "edge0/ranks",
    "edge0/server",
    "edge0/hub",
    "edge0/options",
    "edge0/tune",
    "tiers",
    "edge0/engine.py",
    "edge0/errors.py",
)


def family_words() -> set[str]:
    """Every model_type a family answers for, its name and their hyphenated forms."""
    words = set(FAMILIES) | {f.name for f in every_family()}
    return words | {w.replace("_", "-") for w in words}


def names_in(text: str, words: set[str]) -> list[str]:
    """The family names in `text`, case-insensitive, as whole words."""
    pattern = r"(?<![\w-])(" + "|".join(map(re.escape, sorted(words, key=len)[::-1])) + r")\b"
    return sorted({m.group(1).lower() for m in re.finditer(pattern, text, re.I)})


def test_family_agnostic_packages_name_no_family() -> None:
    words = family_words()
    found = []
    for entry in AGNOSTIC:
        path = ROOT / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            for i, line in enumerate(file.read_text().splitlines(), 1):
                if hit := names_in(line, words):
                    found.append(f"{file.relative_to(ROOT)}:{i}: {', '.join(hit)}")
    assert not found, "family names outside edge0/families/:\n" + "\n".join(found)


def test_the_check_finds_names_in_code_and_comments() -> None:
    words = family_words()
    assert names_in('if model_type == "qwen3_moe":', words) == ["qwen3_moe"]
    assert names_in("# experts with biases (GPT-OSS)", words) == ["gpt-oss"]
    assert names_in("STACKED = {'mixtral', 'kimi_k2'}", words) == ["kimi_k2", "mixtral"]
    assert names_in("qwen3_5_moe_text", words) == ["qwen3_5_moe_text"]
    assert names_in("a family's router (block.gate)", words) == []
