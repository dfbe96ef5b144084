"""What the other rooms see of the scheduler: compute's `ExpertSource` (acquire, prefetch), the
step clock's `StepIO` and a read-only `ReadView` (docs/runtime.md, "The I/O room")."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal, Protocol, overload

import attrs

from edge0.runtime.io.slots import SlotPool
from edge0.runtime.io.tickets import ReadStats

__all__ = ["Arrivals", "ClockSource", "ExpertSource", "FenceNeeded", "ReadView", "StepIO"]


class FenceNeeded(Exception):
    """acquire found the pool full of slots that unevaluated graphs may still read."""


@attrs.define(slots=True)
class Arrivals:
    """An `acquire(..., arrivals=True)`: the `slots` of the experts asked, in their order, and
    whether all are `done` (ready); else `arrived(pending)` blocks until at least one of the
    positions in `pending` is ready, and returns those that are (a failed read raises)."""

    slots: list[int]
    done: bool
    arrived: Callable[[list[int]], list[int]]


class ExpertSource(Protocol):
    """Compute's only way to the experts: slots for a layer's set, and reads ahead of need."""

    @overload
    def acquire(
        self, layer: int, step: int, experts: list[int], fenced: bool = True
    ) -> list[int]: ...
    @overload
    def acquire(
        self, layer: int, step: int, experts: list[int], *, arrivals: Literal[True]
    ) -> Arrivals: ...
    @overload
    def acquire(self, layer: int, step: int, experts: list[int], *, within: float) -> set[int]: ...
    @overload
    def acquire(
        self, layer: int, step: int, experts: list[int], *, servable: Literal[True]
    ) -> set[int]: ...
    def acquire(
        self,
        layer: int,
        step: int,
        experts: list[int],
        fenced: bool = True,
        *,
        arrivals: bool = False,
        within: float | None = None,
        servable: bool = False,
    ) -> list[int] | Arrivals | set[int]:
        """The slots of `experts` of `layer` for compute at `step`, once their reads land.

        `fenced`: every earlier layer of `step` is evaluated (else a full pool raises
        `FenceNeeded`). `arrivals`: issue the reads, return at once (`Arrivals`).
        `within`: the experts ready within that many seconds (reads issued for all).
        `servable`: those ready in a slot or in the RAM cache now (nothing read or held).
        """
        ...

    @overload
    def prefetch(
        self,
        layer: int,
        step: int,
        experts: list[int],
        *,
        unless_servable: bool = False,
        keep: bool = False,
    ) -> int: ...
    @overload
    def prefetch(
        self, layer: int, step: int, experts: list[int], *, staged: Literal[True]
    ) -> list[int]: ...
    def prefetch(
        self,
        layer: int,
        step: int,
        experts: list[int],
        *,
        unless_servable: bool = False,
        keep: bool = False,
        staged: bool = False,
    ) -> int | list[int]:
        """Stage `experts` of `layer` for `step`; the number of reads issued.

        `unless_servable`: only those not servable now. `keep`: hold those a slot has and
        copy those the RAM cache has on this thread (no ticket; the number copied).
        `staged`: hold every other expert of the layer ready in a slot (`experts` is the
        plan, staged before) and return them.
        """
        ...


class StepIO(Protocol):
    """The step clock's side: request and step boundaries, the fence, the order of reads."""

    def begin_request(self, request: int) -> None: ...

    def end_request(self) -> int: ...

    def begin_step(self, step: int) -> None: ...

    def evaluated(self, step: int, layer: int) -> None: ...

    def forget_failures(self) -> None: ...

    def batched(self) -> AbstractContextManager[None]: ...

    def demand_first(self) -> AbstractContextManager[None]: ...

    def deferred(self) -> AbstractContextManager[None]: ...


class ReadView(Protocol):
    """The counters and the pool, read only (the engine's summary, the live view)."""

    @property
    def stats(self) -> ReadStats: ...

    @property
    def table(self) -> SlotPool: ...

    def counters(self) -> ReadStats: ...

    def io_time(self, since: float, until: float) -> float: ...


class ClockSource(ExpertSource, StepIO, ReadView, Protocol):
    """What the step clock holds: it hands the layers the `ExpertSource` and drives `StepIO`."""
