"""tools/config_probe.py over every probe, against the committed transformers references:
each config value off a family's defaults is computed within 1e-4 of transformers (the
greedy chain equal) or refused where transformers refuses or fails too; no silent
difference, no escaped exception. A refusal of a value transformers computes would be
named here and in docs/models.md with its reason; there is none."""

from __future__ import annotations

import pytest
from tool_helpers import load_tool

from edge0.synth.fidelity_probes import PROBES

# probes transformers computes and Edge0 refuses, each with its reason in docs/models.md
REFUSED: set[str] = set()


@pytest.fixture(scope="module")
def probe() -> tuple[object, dict[str, object]]:
    tool = load_tool("tools/config_probe.py")
    return tool, tool.load_specs()


@pytest.mark.parametrize("name", sorted(PROBES))
def test_probe_is_computed_or_refused_as_transformers(
    probe: tuple[object, dict[str, object]], name: str
) -> None:
    tool, specs = probe
    base, changes = PROBES[name]
    line = tool.golden(name, base, changes, specs)  # type: ignore[attr-defined]
    if name in REFUSED:
        assert line.startswith("REFUSED (transformers computes it)"), line
        assert "\n" not in line
    else:
        assert line.startswith(("ok ", "refused as transformers")), line


def test_every_probe_has_a_committed_reference(probe: tuple[object, dict[str, object]]) -> None:
    _, specs = probe
    assert sorted(specs) == sorted(PROBES)
