"""Routing traces on disk, one window at a time, for training without holding them in memory.

One directory per part (calibration, held-out): `hidden.npy` (n, L, S, d) float16,
`topk.npy` (n, L, S, k) int16, `logits.npy` (n, L, S, E) float32 and `tokens.npy` (n, S)
int32, created at full size and filled window by window through memory maps, plus
`state.json` (what the traces are of, and how many windows are complete). A run that was
killed resumes after the last complete window; training reads the arrays memory-mapped,
so only the rows a step samples are paged in (the page cache gives them back under a
memory cap). The arrays are those of edge0.train.traces (`TraceSet`), which trains on them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from numpy.lib.format import open_memmap

from edge0.log import get_logger
from edge0.train.traces import TraceMeta, TraceSet

log = get_logger(__name__)
STATE = "state.json"
ARRAYS = ("hidden", "topk", "logits", "tokens")


@attrs.frozen
class Shape:
    """What one part's arrays hold: windows x MoE layers x tokens, and the model's sizes."""

    windows: int
    seq_len: int
    moe_layers: tuple[int, ...]
    d_model: int
    num_experts: int
    top_k: int

    def arrays(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        n, layers, s = self.windows, len(self.moe_layers), self.seq_len
        return {
            "hidden": ((n, layers, s, self.d_model), np.float16),
            "topk": ((n, layers, s, self.top_k), np.int16),
            "logits": ((n, layers, s, self.num_experts), np.float32),
            "tokens": ((n, s), np.int32),
        }

    def bytes(self) -> int:
        return sum(
            int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in self.arrays().values()
        )


class TraceStore:
    """One part's traces: `write` a window, `done` windows so far, `trace_set` to train."""

    def __init__(self, root: Path, shape: Shape, key: str) -> None:
        self.root, self.shape, self.key = root, shape, key
        self._maps: dict[str, np.memmap] = {}

    @classmethod
    def open(cls, root: Path, shape: Shape, key: str) -> TraceStore:
        """The store at `root`, resumed when it holds traces of the same `key` and shape, else
        created afresh (a different model, corpus or size: its old windows are useless)."""
        store = cls(root, shape, key)
        state = store._state()
        if state.get("key") != key or state.get("shape") != store._shape_json():
            if state:
                log.info("tune.traces_restart", dir=str(root), why="different model or corpus")
            store._create()
        return store

    @property
    def done(self) -> int:
        return int(self._state().get("done", 0))

    def write(
        self,
        index: int,
        hidden: np.ndarray,
        topk: np.ndarray,
        logits: np.ndarray,
        tokens: np.ndarray,
    ) -> None:
        """Window `index` (the next one): (L, S, d), (L, S, k), (L, S, E), (S,); then marked
        done once its bytes are on disk."""
        maps = self._mapped("r+")
        for name, value in zip(ARRAYS, (hidden, topk, logits, tokens), strict=True):
            maps[name][index] = value
            maps[name].flush()
        self._save_state(index + 1)

    def close(self) -> None:
        """Unmap the files written (write() maps them again when needed)."""
        self._maps = {}

    def trace_set(self, source: str, model: str) -> TraceSet:
        """The complete windows as a TraceSet over read-only memory maps."""
        s = self.shape
        meta = TraceMeta(
            s.moe_layers, s.d_model, s.num_experts, s.top_k, s.seq_len, self.done, (), source, model
        )
        maps = {n: np.load(self.root / f"{n}.npy", mmap_mode="r") for n in ARRAYS}
        return TraceSet(meta, *(maps[n][: self.done] for n in ("hidden", "topk", "logits")))

    def tokens(self) -> np.ndarray:
        return np.load(self.root / "tokens.npy", mmap_mode="r")[: self.done]

    # --- files -----------------------------------------------------------------------------

    def _create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name, (shape, dtype) in self.shape.arrays().items():
            open_memmap(self.root / f"{name}.npy", mode="w+", dtype=dtype, shape=shape).flush()
        self._maps = {}
        self._save_state(0)

    def _mapped(self, mode: str) -> dict[str, np.memmap]:
        if not self._maps:
            self._maps = {n: open_memmap(self.root / f"{n}.npy", mode=mode) for n in ARRAYS}
        return self._maps

    def _state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads((self.root / STATE).read_text())
            return state
        except (OSError, ValueError):
            return {}

    def _shape_json(self) -> Any:
        return json.loads(json.dumps(attrs.asdict(self.shape)))  # tuples as JSON gives them

    def _save_state(self, done: int) -> None:
        state = {"key": self.key, "shape": self._shape_json(), "done": done}
        tmp = self.root / f"{STATE}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.root / STATE)
