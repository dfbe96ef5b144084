"""A step's raw trace summed up per layer: the `step` event of the event stream (docs/server.md,
"The event stream"). Runs on the event loop, once per step, only while someone listens.
"""

from __future__ import annotations

from typing import Any

from edge0.runtime.compute.live import StepTrace
from edge0.runtime.io.tickets import DEMAND, PREFETCH, FetchTicket

MS = 1e3


def _layer(layer: int) -> dict[str, Any]:
    return {
        "layer": layer,
        "compute_ms": 0.0,  # MLX evaluations and host predictions of this layer
        "blocked_ms": 0.0,  # compute waiting for this layer's slots
        "ahead": 0,  # reads issued a step ahead (prefetch) that finished
        "ahead_ms": 0.0,
        "demand": 0,  # reads issued when compute asked (misses)
        "demand_ms": 0.0,
        "bytes": 0,
        "cache_hits": 0,  # reads served by a cache tier (the RAM tier)
        "asked": 0,  # experts compute asked of the slots
        "staged": 0,  # ... found staged or in flight (slot hits)
        "held": 0,  # experts in this layer's slots at the step's end
        "predicted": 0,  # exact modes: the set predicted for this step ...
        "predicted_hits": 0,  # ... and how many of it the layer ran (recall = hits / predicted)
    }


class Timeline:
    """Turns StepTraces into `step` events; keeps reads that finished before their step."""

    def __init__(self) -> None:
        self._early: dict[int, list[FetchTicket]] = {}  # step -> reads for it, seen earlier

    def event(self, trace: StepTrace) -> dict[str, Any]:
        """The `step` event of `trace` (its reads, its spans, per layer)."""
        for t in trace.reads:
            self._early.setdefault(t.step, []).append(t)
        reads = self._early.pop(trace.step, [])
        late = 0
        for step in [s for s in self._early if s < trace.step]:  # past steps: wasted, late
            late += len(self._early.pop(step))
        layers: dict[int, dict[str, Any]] = {}

        def row(layer: int) -> dict[str, Any]:
            got = layers.get(layer)
            if got is None:
                got = layers[layer] = _layer(layer)
            return got

        compute = blocked = 0.0
        for kind, layer, start, end in trace.spans:
            ms = (end - start) * MS
            if kind == "wait":
                blocked += ms
            else:
                compute += ms
            if layer >= 0:
                row(layer)["blocked_ms" if kind == "wait" else "compute_ms"] += ms
        failed = self._add_reads(reads, row)
        for layer, asked, staged in trace.asked:
            r = row(layer)
            r["asked"] += asked
            r["staged"] += staged
        for layer, n in trace.held.items():
            if layer in layers or n:
                row(layer)["held"] = n
        for layer, planned in trace.predicted.items():
            ran = set(trace.executed.get(layer, ()))
            r = row(layer)
            r["predicted"] = len(planned)
            r["predicted_hits"] = len(ran.intersection(planned))
        for r in layers.values():
            for key in ("compute_ms", "blocked_ms", "ahead_ms", "demand_ms"):
                r[key] = round(r[key], 3)
        hits, slots = trace.recall
        return {
            "request": None if trace.batch else trace.request,  # a batch: several requests
            "step": trace.step,
            "prefill": trace.prefill,
            "batch": trace.batch,
            "wall_ms": round(trace.wall * MS, 3),
            "compute_ms": round(compute, 3),
            "blocked_ms": round(blocked, 3),
            "bytes": sum(r["bytes"] for r in layers.values()),
            "failed_reads": failed,
            "late_reads": late,
            "route_recall": [hits, slots],
            "layers": [layers[k] for k in sorted(layers)],
        }

    @staticmethod
    def _add_reads(reads: list[FetchTicket], row: Any) -> int:
        failed = 0
        for t in reads:
            if t.outcome != "ok":
                failed += int(t.outcome == "error")
                continue
            r = row(t.layer)
            ms = (t.finished - t.started) * MS
            if t.kind == PREFETCH:
                r["ahead"] += 1
                r["ahead_ms"] += ms
            elif t.kind == DEMAND:
                r["demand"] += 1
                r["demand_ms"] += ms
            r["bytes"] += t.nbytes
            r["cache_hits"] += int(t.hit)
        return failed
