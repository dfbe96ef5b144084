"""Config values off each family's defaults that transformers applies: the config audit's probes.

Each probe is a family's tiny fixture (its `tiny` config) with some config values
changed: every rope type transformers computes, and the family's own `probes` (a family
that declares none, like kimi_k2 beside deepseek_v3, is probed through its base);
tools/config_probe.py runs transformers and Edge0 on it and prints the logit delta or
Edge0's refusal. A family's `variants` (its computed non-default values) are committed as
fixtures with golden logits (tests/fixtures/families/<model_type>-<suffix>.json); its
`refusals` are checked by tests/test_config_fidelity.py for their one-line message.
"""

from __future__ import annotations

from typing import Any

from edge0.families import Family, every_family
from edge0.families.probes import ROPES


def _prefix(family: Family) -> str:
    """Where the text model's fields are (`text_config.` in a multimodal wrapper)."""
    return "text_config." if family.text_type is not None else ""


def _probes(family: Family) -> dict[str, tuple[str, dict[str, Any]]]:
    """The rope probes of `family`'s fixture, then its own."""
    base, prefix = family.name, _prefix(family)
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for kind, rope in ROPES.items():
        changes: dict[str, Any] = {f"{prefix}rope_parameters": dict(rope)}
        if kind == "dynamic":  # dynamic NTK rescales past max_position_embeddings only
            changes[f"{prefix}max_position_embeddings"] = 16
        out[f"{base}-rope-{kind}"] = (base, changes)
    for name, changes in family.own("probes").items():  # a family's own replace the rope ones
        out[f"{base}-{name}"] = (base, changes)
    return out


_TINY = [f for f in every_family() if type(f).tiny is not Family.tiny]
# probe name -> (fixture, config changes)
PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    name: probe for f in _TINY if f.own("probes") for name, probe in _probes(f).items()
}
# computed non-default values, committed with golden logits (tools/family_fixtures.py NAME)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    f"{f.name}-{suffix}": (f.name, changes)
    for f in _TINY
    for suffix, changes in f.own("variants").items()
}
# refused values: (fixture, config changes, the start of the one-line refusal)
REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    (f.name, changes, message) for f in _TINY for changes, message in f.own("refusals")
]
