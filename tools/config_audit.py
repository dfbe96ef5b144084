"""Print the config audit of docs/models.md from the families' own rows (`Family.fields`).

Rows shared by every family first, then each model_type's own rows with transformers'
default for that model_type. tests/test_config_fidelity.py checks docs/models.md holds
exactly this text, so the audit says what the code does. Usage:

    .venv/bin/python tools/config_audit.py
"""

from __future__ import annotations

import json
from typing import Any

import click

from edge0.families import supported_list
from edge0.families.audit import COMPUTED, EDGE0, IRRELEVANT, ROPE_KEYS, Rope, Rule
from edge0.families.common import COMMON, WRAPPER
from edge0.model.fields import table, transformers_view, wrapped

VERDICT = {COMPUTED: "computed", EDGE0: "Edge0 reads it", IRRELEVANT: "irrelevant"}


def verdict(rule: Rule | Rope) -> str:
    if isinstance(rule, Rope):
        keys = sorted(set().union(*(ROPE_KEYS[t] for t in rule.types)) - {"partial_rotary_factor"})
        share = (
            "partial_rotary_factor (the rotated share)"
            if rule.partial
            else "partial_rotary_factor 1 with a scaled rope (a plain one ignores it)"
        )
        return (
            f"computed for rope_type {', '.join(rule.types)}: rope_theta, {', '.join(keys)}; "
            f"{share}; sub-keys transformers does not read change nothing"
        )
    if rule.accepts is not None and rule.does == COMPUTED:
        return f"computed; refused unless {rule.accepted}"
    if rule.accepts is not None:
        return f"refused unless {rule.accepted}"
    return VERDICT[rule.does]


def row(key: str, rule: Rule | Rope, view: dict[str, Any] | None = None) -> str:
    cells = [f"`{key}`"]
    if view is not None and key not in view:
        cells.append("not a field of the class (read when config.json has it)")
    elif view is not None:
        text = json.dumps(view[key])
        cells.append(f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`")
    cells += [verdict(rule), rule.why]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def audit() -> str:
    lines = [
        "### Every family",
        "",
        "| field | Edge0 | what transformers does / why |",
        "|---|---|---|",
    ]
    lines += [row(k, r) for k, r in COMMON.items()]
    lines += [
        "",
        "Multimodal wrappers (`qwen3_5_moe`, `llama4`): the fields beside `text_config`.",
        "",
        "| field | Edge0 | what transformers does / why |",
        "|---|---|---|",
    ]
    lines += [row(k, r) for k, r in WRAPPER.items()]
    for model_type in supported_list().split(", "):
        view = transformers_view({"model_type": model_type})
        if wrapped(model_type):
            view = view["text_config"]
        own = {k: r for k, r in table(model_type).items() if COMMON.get(k) is not r}
        title = f"`{model_type}`" + (" (`text_config`)" if wrapped(model_type) else "")
        lines += [
            "",
            f"### {title}",
            "",
            "| field | transformers default | Edge0 | what transformers does / why |",
            "|---|---|---|---|",
        ]
        lines += [row(k, r, view) for k, r in sorted(own.items())]
    return "\n".join(lines) + "\n"


@click.command()
def main() -> None:
    click.echo(audit(), nl=False)


if __name__ == "__main__":
    main()
