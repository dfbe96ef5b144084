"""Tier spec strings ("ram:1GiB>throttle:preset=sata>pread"): parsing, the tier registry, stacks
(docs/tiers.md, "Spec strings" and "Adding a tier").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs

from edge0.errors import ConfigError
from edge0.layout.manifest import Manifest
from edge0.storage.tier import Tier

ENTRY_POINT_GROUP = "edge0.tiers"

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*"


# --- option converters (text -> value); they raise ValueError on bad text ---
def parse_size(text: str) -> int:
    """Bytes from "1GiB", "512MiB", "400MB", "16k", "4096" (units are case-insensitive)."""
    m = re.fullmatch(_NUMBER + r"([a-z]*)\s*", text.strip().lower())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"{text!r} is not a size; write e.g. 1GiB, 512MiB, 400MB or 4096")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if not value < 2**63:  # 1e400 is inf: no size is that large
        raise ValueError(f"{text!r} is too large a size; write e.g. 1GiB, 512MiB or 4096")
    return int(value)


def parse_rate(text: str) -> float:
    """Bytes per second from "400MB/s", "1.5GiB/s", "2GB" (the "/s" is optional)."""
    t = text.strip().lower()
    t = t[:-2] if t.endswith("/s") else t
    try:
        value = float(parse_size(t)) if not re.fullmatch(_NUMBER, t) else float(t)
    except ValueError:
        raise ValueError(f"{text!r} is not a bandwidth; write e.g. 400MB/s or 1.5GiB/s") from None
    if value <= 0:
        raise ValueError(f"bandwidth must be positive, got {text!r}")
    return value


def parse_duration(text: str) -> float:
    """Seconds from "200us", "1.5ms", "0.01s", "0" (a bare number is seconds)."""
    m = re.fullmatch(_NUMBER + r"([a-zµ]*)\s*", text.strip().lower())
    if not m or (m.group(2) or "s") not in _TIME_UNITS:
        raise ValueError(f"{text!r} is not a duration; write e.g. 200us, 1.5ms or 0.01s")
    return float(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean; write true or false")


def parse_int(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def choice(*values: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text.strip() not in values:
            raise ValueError(f"{text!r} is not one of {', '.join(values)}")
        return text.strip()

    return convert


# --- parsing -----------------------------------------------------------------
@attrs.frozen
class TierStage:
    """One `name:options` stage of a spec, options still as text."""

    name: str
    positional: str | None  # a bare first option value, if any
    options: tuple[tuple[str, str], ...]


def format_spec(stages: list[TierStage]) -> str:
    """The spec string of parsed stages (`parse_spec(format_spec(s)) == s`)."""
    parts = []
    for st in stages:
        opts = ([st.positional] if st.positional is not None else []) + [
            f"{k}={v}" for k, v in st.options
        ]
        parts.append(st.name + (":" + ",".join(opts) if opts else ""))
    return ">".join(parts)


def parse_spec(spec: str) -> list[TierStage]:
    """Split a spec into stages, outermost first (no registry look-up yet)."""
    if not spec or not spec.strip():
        raise ConfigError("empty tier spec; write e.g. 'pread' or 'ram:1GiB>direct'")
    stages = []
    for part in spec.split(">"):
        name, _, rest = part.strip().partition(":")
        name = name.strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
            raise ConfigError(
                f"bad stage {part.strip()!r} in tier spec {spec!r}; "
                "each stage is name[:options], stages separated by '>', e.g. 'ram:1GiB>pread'"
            )
        positional, options, seen = None, [], set()
        for i, item in enumerate(x.strip() for x in rest.split(",") if rest.strip()):
            key, eq, value = item.partition("=")
            if not eq:
                if i != 0:
                    raise ConfigError(
                        f"option {item!r} of tier {name!r} needs a name (key=value); "
                        "only the first option may be a bare value"
                    )
                positional = item
                continue
            key = key.strip()
            if key in seen:
                raise ConfigError(f"option {key!r} given twice for tier {name!r} in {spec!r}")
            seen.add(key)
            options.append((key, value.strip()))
        stages.append(TierStage(name, positional, tuple(options)))
    return stages


# --- registry ----------------------------------------------------------------
_registered: dict[str, type] = {}


def register_tier(name: str, cls: type) -> None:
    """Make `cls` available under `name` in spec strings of this process.

    Packages register through the `edge0.tiers` entry-point group instead (see
    examples/custom_tier.py); this hook is for scripts and notebooks.
    """
    _registered[name] = cls


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def known_tiers() -> list[str]:
    return sorted(set(_entry_points()) | set(_registered))


def tier_class(name: str) -> type:
    """The tier class registered under `name`; ConfigError listing known names if none."""
    if name in _registered:
        return _registered[name]
    ep = _entry_points().get(name)
    if ep is None:
        raise ConfigError(
            f"unknown tier {name!r}; known tiers: {', '.join(known_tiers())} "
            f"(third-party tiers register in the {ENTRY_POINT_GROUP!r} entry-point group)"
        )
    try:
        cls: type = ep.load()
    except Exception as exc:  # a broken plug-in: name it, do not crash with its traceback
        raise ConfigError(f"tier {name!r} ({ep.value}) failed to load: {exc}") from exc
    return cls


def _convert_options(stage: TierStage, cls: type) -> dict[str, Any]:
    table: dict[str, Callable[[str], Any]] = getattr(cls, "OPTIONS", {})
    pairs = list(stage.options)
    if stage.positional is not None:
        pos = getattr(cls, "POSITIONAL", None)
        if pos is None:
            raise ConfigError(
                f"tier {stage.name!r} takes no bare value ({stage.positional!r}); "
                f"use key=value with one of: {', '.join(table) or '(no options)'}"
            )
        if pos in dict(stage.options):
            raise ConfigError(f"option {pos!r} of tier {stage.name!r} given twice")
        pairs.insert(0, (pos, stage.positional))
    out = {}
    for key, text in pairs:
        if key not in table:
            raise ConfigError(
                f"tier {stage.name!r} has no option {key!r}; "
                f"options: {', '.join(table) or '(none)'}"
            )
        try:
            out[key] = table[key](text)
        except ValueError as exc:
            raise ConfigError(f"tier {stage.name!r} option {key}: {exc}") from None
    return out


def open_tiers(spec: str | Tier, model_dir: Path, manifest: Manifest) -> Tier:
    """Build the tier stack a spec describes (or return a ready Tier object unchanged)."""
    if not isinstance(spec, str):
        if not isinstance(spec, Tier):
            raise ConfigError(f"tiers must be a spec string or a Tier object, got {spec!r}")
        return spec
    # 1. resolve and convert everything before opening any file
    plan = check_spec(spec)
    # 2. build innermost first
    cls, opts = plan[-1]
    tier: Tier = cls(Path(model_dir), manifest, **opts)
    try:
        for cls, opts in reversed(plan[:-1]):
            tier = cls(tier, **opts)
    except BaseException:
        _abandon(tier)
        raise
    return tier


def check_spec(spec: str) -> list[tuple[type, dict[str, Any]]]:
    """(tier class, converted options) per stage, outermost first; ConfigError for a bad spec.

    Opens no file: the CLI calls it before any model is loaded.
    """
    stages = parse_spec(spec)
    plan = []
    for i, stage in enumerate(stages):
        cls = tier_class(stage.name)
        wraps = bool(getattr(cls, "WRAPS", False))
        last = i == len(stages) - 1
        if wraps and last:
            raise ConfigError(
                f"tier {stage.name!r} wraps another tier; end the spec with a storage tier, "
                f"e.g. '{spec}>pread'"
            )
        if not wraps and not last:
            raise ConfigError(
                f"tier {stage.name!r} reads the model directory and must be the last stage "
                f"of {spec!r}"
            )
        plan.append((cls, _convert_options(stage, cls)))
    return plan


def _abandon(tier: Any) -> None:
    """Release the files of a half-built stack (tiers that offer `close_sync`)."""
    while tier is not None:
        close = getattr(tier, "close_sync", None)
        if close is not None:
            close()
        tier = getattr(tier, "inner", None)
