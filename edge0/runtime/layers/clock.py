"""What a streaming layer reads of its step clock (edge0.runtime.compute.steps.Steps implements
it), and the executor a step hands its streaming blocks (one token, a prompt chunk, a batch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import mlx.core as mx

from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.source import ExpertSource
from edge0.runtime.layers.syncs import SyncGroups


@attrs.define
class StepRecord:
    """Timing of one step on the compute thread (seconds)."""

    step: int
    prefill: bool
    wall: float = 0.0
    eval: float = 0.0  # in mx.eval (MLX compute)
    wait: float = 0.0  # blocked on reads
    predict: float = 0.0  # predictor graphs (MLX compute, included in `eval` too)
    layers: int = 0  # streamed layers run
    cpu: float = 0.0  # CPU time of the compute thread over the step (time.thread_time)
    cpu_excluded: float = 0.0  # ... of it inside mx.eval (spans given a cpu figure)
    syncs: int = 0  # host syncs (evaluations compute waited for), the step fence included
    recall_hits: int = 0  # routed layers: experts run that are in the true top-K (when known)
    recall_slots: int = 0  # ... out of this many (K per layer whose true top-K was read back)
    lead_reads: int = 0  # reads started one layer ahead by the deadline route policy


class MoEExecutor(Protocol):
    """How the step under way runs a streaming block: one token (edge0.runtime.layers.single),
    a prompt chunk (edge0.runtime.prefill.chunks.ChunkState), a batched step
    (edge0.runtime.compute.batch.BatchStep). The step clock holds the current one."""

    def forward(self, block: Any, x: mx.array) -> mx.array:
        """The streaming block `block` (a StreamingMoE) on its input `x`: its output."""
        ...


class Clock(Protocol):
    """The step clock as the layers read it: where the step is, its counters, its spans."""

    routed_by_prediction: int  # layer-steps whose routing was the prediction

    @property
    def top_k(self) -> int: ...

    @property
    def step(self) -> int: ...

    @property
    def pos(self) -> int: ...

    @property
    def prefill(self) -> bool: ...

    @property
    def prefetching(self) -> bool: ...

    @property
    def scheduler(self) -> ExpertSource | None: ...

    @property
    def memory(self) -> SlotMemory | None: ...

    @property
    def groups(self) -> SyncGroups | None: ...

    @property
    def cur(self) -> StepRecord: ...

    @property
    def recording(self) -> dict[tuple[int, int], list[int]] | None: ...

    @property
    def layers(self) -> Mapping[int, object]: ...

    def span(self, kind: str, layer: int, start: float, end: float, cpu: float = 0.0) -> None: ...

    def count_recall(self, used: list[int], true: list[int]) -> None: ...
