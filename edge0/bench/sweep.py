"""`edge0 bench sweep`: decode tok/s against emulated storage bandwidth, with compute-only bounds
(docs/benchmarks/sweep.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from edge0.bench.run import Variant
from edge0.errors import ConfigError

BOUNDS = ("resident", "route")


@attrs.frozen
class Sweep:
    bandwidths: tuple[float, ...]  # GB/s (decimal)
    modes: tuple[str, ...]
    k: int | None
    lat: str = "100us"
    inner: str = "pread"
    bounds: tuple[str, ...] = ("resident",)
    predictor: str = "init"

    def spec(self, gbs: float) -> str:
        return f"throttle:bw={gbs:g}GB/s,lat={self.lat}>{self.inner}"

    def points(self) -> list[tuple[float, Variant]]:
        return [
            (b, Variant(m, self.k, self.spec(b), self.predictor))
            for b in self.bandwidths
            for m in self.modes
        ]

    def bound_variants(self) -> list[Variant]:
        for b in self.bounds:
            if b not in BOUNDS:
                raise ConfigError(f"unknown bound {b!r}; choose from {', '.join(BOUNDS)}")
        return [Variant(b, self.k, self.inner, self.predictor) for b in self.bounds]

    def variants(self) -> list[Variant]:
        return [v for _, v in self.points()] + self.bound_variants()


def parse_bandwidths(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(
            f"--bandwidths takes GB/s numbers like 0.1,0.4,1.6, not {text!r}"
        ) from None
    if not out or min(out) <= 0:
        raise ConfigError("--bandwidths needs at least one positive GB/s value")
    return out


def curves(sweep: Sweep, report: dict[str, Any]) -> dict[str, Any]:
    """mode -> [(GB/s, median, min, max) decode tok/s], and bound label -> median tok/s."""
    by_label = {v["label"]: v for v in report["variants"]}
    points: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in sweep.modes}
    for gbs, v in sweep.points():
        row = by_label[v.label]
        if row.get("runs_ok"):
            points[v.mode].append(
                (
                    gbs,
                    row["median"]["decode_tps"],
                    row["min"]["decode_tps"],
                    row["max"]["decode_tps"],
                )
            )
    bounds = {}
    for v in sweep.bound_variants():
        row = by_label[v.label]
        if row.get("runs_ok"):
            name = "resident (no reads)" if v.mode == "resident" else f"{v.mode} over {v.tiers}"
            bounds[f"{name}: {row['median']['decode_tps']:.2f} tok/s"] = row["median"]["decode_tps"]
    return {"points": points, "bounds": bounds}


def table(sweep: Sweep, report: dict[str, Any]) -> str:
    """Markdown: one row per bandwidth, decode tok/s and blocked ms/step per mode, ratio."""
    by_label = {v["label"]: v for v in report["variants"]}
    ratio = {r["variant"]: r for r in report["ratios"]}
    modes: Sequence[str] = sweep.modes
    head = ["GB/s"] + [f"{m} tok/s" for m in modes] + [f"{m} blocked ms/step" for m in modes]
    head += [f"{m} / reactive" for m in modes if m in ("hint", "route") and "reactive" in modes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for gbs in sweep.bandwidths:
        cells, blocked, rs = [f"{gbs:g}"], [], []
        for m in modes:
            v = Variant(m, sweep.k, sweep.spec(gbs), sweep.predictor)
            row = by_label[v.label]
            if not row.get("runs_ok"):
                cells.append("failed")
                blocked.append("-")
            else:
                med = row["median"]
                cells.append(f"{med['decode_tps']:.2f} ±{100 * row['decode_spread']:.0f}%")
                blocked.append(f"{med['blocked_ms_per_step']:.1f}")
            if m in ("hint", "route") and "reactive" in modes:
                r = ratio.get(v.label)
                rs.append(f"{r['median']:.2f}x" if r else "-")
        lines.append("| " + " | ".join(cells + blocked + rs) + " |")
    for v in sweep.bound_variants():
        row = by_label[v.label]
        if row.get("runs_ok"):
            lines.append(
                f"\nbound, {v.label}: {row['median']['decode_tps']:.2f} tok/s "
                f"(±{100 * row['decode_spread']:.0f}%)"
            )
    return "\n".join(lines)
