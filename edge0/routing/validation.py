"""Whether a layout's routing heads were validated, and so which mode a run takes by default
(docs/prerouter.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
from collections.abc import Iterator
from pathlib import Path

import attrs

from edge0.log import get_logger
from edge0.options.engine import EXACT_MODES, EngineOptions
from edge0.routing.prerouter_config import FILES

log = get_logger(__name__)
KEY = "validation"  # under prerouter.json's "info"
# route becomes the default only where its greedy tokens agreed with exact decoding this
# often on held-out text (the demo's tuned heads: 82.5%; a random-weight model's: 0%)
ROUTE_FLOOR = 0.8
# what the stats line says of a route run's predictor without a validation record
UNVALIDATED = {"heads": "heads not validated", "init": "untrained heads"}


@attrs.frozen
class Validation:
    """The held-out figures of a layout's token heads at routing capacity `k`."""

    k: int
    agreement: float  # route's greedy next token equals the exact one (share of positions)
    kl_mean: float  # mean per-token KL(exact || route)
    recall: float  # mean recall@k of the heads against the true routing
    tokens: int  # held-out tokens measured

    @classmethod
    def read(cls, layout: str | Path) -> Validation | None:
        """The record in `layout`'s prerouter.json, or None (no heads, untrained, no record,
        or a record this version cannot read)."""
        path = Path(layout) / FILES["token"][1]
        try:
            config = json.loads(path.read_text())
            record = config["info"][KEY] if config.get("trained") else None
            return None if record is None else cls(**{f: record[f] for f in _FIELDS})
        except (OSError, ValueError, KeyError, TypeError):
            return None


_FIELDS = [a.name for a in attrs.fields(Validation)]


def default_mode(layout: str | Path, opts: EngineOptions) -> str:
    """`route` when the layout's trained heads carry a validation record for the asked
    capacity whose agreement clears ROUTE_FLOOR (and the heads are the predictor), else
    `hint`."""
    if opts.predictor not in (None, "heads"):
        return "hint"
    record = Validation.read(layout)
    if record is None or (opts.top_k is not None and opts.top_k != record.k):
        return "hint"
    return "route" if record.agreement >= ROUTE_FLOOR else "hint"


def with_mode(opts: EngineOptions, layout: str | Path) -> EngineOptions:
    """`opts` with its mode decided: as given, or by `default_mode`."""
    if opts.mode is not None:
        return opts
    if opts.route_policy != "predicted":  # a route policy asks for route mode
        return attrs.evolve(opts, mode="route")
    return attrs.evolve(opts, mode=default_mode(layout, opts))


def exactness(opts: EngineOptions, layout: str | Path | None, predictor: str) -> str:
    """What the stats line says of a run's output: `exact`, or `approximate (route, ...)`."""
    if opts.mode in EXACT_MODES:
        return "exact"
    deadline = opts.route_deadline_ms
    if opts.route_policy != "predicted" and deadline is not None and math.isinf(deadline):
        return "exact"  # every true expert is waited for
    record = Validation.read(layout) if layout is not None and predictor == "heads" else None
    if record is None:
        what = UNVALIDATED.get(predictor, f"{predictor} predictor")
        return f"approximate (route, {what})"
    note = "" if opts.top_k in (None, record.k) else f" at K={record.k}"
    return f"approximate (route, agreement {record.agreement:.1%}{note})"


_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("edge0_route_quiet", default=False)


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """No warning from engines opened in this context (`edge0 tune` validating new heads)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def warn_unvalidated(label: str) -> None:
    """Say once, when the engine opens, that an explicit route mode's output is approximate."""
    if _quiet.get():
        return
    log.warning(
        "route.approximate",
        note=f"output is {label}: route mode computes with the predicted experts; run "
        "`edge0 tune MODEL` to train and validate heads, or use --mode hint (exact)",
    )
