"""The one tracing helper every read and compute span goes through: structlog events and the
Chrome trace (docs/runtime.md, "Tracing and the summary").
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from edge0.log import get_logger
from edge0.runtime.io.tickets import FetchTicket

PID = 1
COMPUTE_TID = 0


class TraceSink(Protocol):
    """Something that also sees every read and compute span (edge0.runtime.compute.live)."""

    def read(self, ticket: FetchTicket) -> None: ...

    def compute(self, kind: str, step: int, layer: int, start: float, end: float) -> None: ...


class Tracer:
    """Emits one structlog event per read and per compute span; optionally keeps a timeline."""

    def __init__(self, chrome: bool = False) -> None:
        self.chrome = chrome
        self.origin = time.perf_counter()
        self.events: list[dict[str, Any]] = []
        self._workers: set[int] = set()
        # bound once: a lazy proxy re-binds on every call (~6 us); the bound logger ~0.5 us
        self._log = get_logger("edge0.runtime.io.trace").bind()
        self.logging = bool(self._log.is_enabled_for(logging.DEBUG))
        self._lock = threading.Lock()
        self.sink: TraceSink | None = None  # set only while someone watches (one check per event)

    def _us(self, t: float) -> float:
        return round((t - self.origin) * 1e6, 1)

    def read(self, ticket: FetchTicket) -> None:
        """A ticket finished (ok, error or cancelled)."""
        sink = self.sink
        if sink is not None:
            sink.read(ticket)
        if self.logging:
            self._log.debug("read", **ticket.fields())
        if not self.chrome or not ticket.started:
            return
        tid = 1 + max(ticket.worker, 0)
        event = {
            "name": f"L{ticket.layer} e{ticket.expert}",
            "cat": f"read.{ticket.kind}",
            "ph": "X",
            "ts": self._us(ticket.started),
            "dur": round((ticket.finished - ticket.started) * 1e6, 1),
            "pid": PID,
            "tid": tid,
            "args": ticket.fields(),
        }
        with self._lock:
            self._workers.add(tid)
            self.events.append(event)

    def compute(self, kind: str, step: int, layer: int, start: float, end: float) -> None:
        """A span of the compute thread: `kind` is eval, wait, predict or sample."""
        sink = self.sink
        if sink is not None:
            sink.compute(kind, step, layer, start, end)
        if self.logging:
            self._log.debug(
                "compute", kind=kind, step=step, layer=layer, ms=round((end - start) * 1e3, 3)
            )
        if not self.chrome:
            return
        event = {
            "name": f"{kind} L{layer}" if layer >= 0 else kind,
            "cat": f"compute.{kind}",
            "ph": "X",
            "ts": self._us(start),
            "dur": round((end - start) * 1e6, 1),
            "pid": PID,
            "tid": COMPUTE_TID,
            "args": {"step": step, "layer": layer},
        }
        with self._lock:
            self.events.append(event)

    def chrome_trace(self) -> dict[str, Any]:
        """The trace as a Chrome JSON object (ui.perfetto.dev and chrome://tracing open it)."""
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": PID, "args": {"name": "edge0"}},
            {
                "name": "thread_name",
                "ph": "M",
                "pid": PID,
                "tid": COMPUTE_TID,
                "args": {"name": "compute"},
            },
        ]
        for tid in sorted(self._workers):
            meta.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": PID,
                    "tid": tid,
                    "args": {"name": f"tier worker {tid - 1}"},
                }
            )
        with self._lock:
            events = list(self.events)
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def write_chrome(self, path: str | Path) -> Path:
        out = Path(path)
        out.write_text(json.dumps(self.chrome_trace()))
        self._log.info("trace_written", path=str(out), events=len(self.events))
        return out
