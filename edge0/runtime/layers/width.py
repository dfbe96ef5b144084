"""hint's prefetch width: predicted experts read ahead per layer, fixed or chosen by measurement
(docs/prerouter.md, "The prefetch width").
"""

from __future__ import annotations

import attrs

from edge0.log import get_logger

log = get_logger("edge0.runtime.layers.width")

EVERY = 16  # decode steps between two decisions
MIN_SAMPLES = 32  # scored predictions before the first decision (until then: K)
SAMPLE = 4  # one step in SAMPLE ranks its predictions and scores them (ranking costs compute)
PRIOR = 4.0  # demand reads' worth of prior: a demand read blocks about one read's time
DECAY = 0.5  # what each decision keeps of the measurements behind it


def room(n_slots: int, top_k: int, layers: int) -> int:
    """The widest prefetch the slot pool holds: a step holds about one set per streamed
    layer (this step's not yet computed, the next step's predicted) plus 2K for the layer
    being computed and the pending one (edge0.runtime.io.slots.pool_size)."""
    return max(top_k, (n_slots - 2 * top_k) // max(layers, 1))


@attrs.define
class Costs:
    """What decode steps measured since the last decision (decayed at each)."""

    wait_s: float = 0.0  # compute blocked on reads
    demand: float = 0.0  # reads compute issued itself (true experts not prefetched)
    busy_s: float = 0.0  # wall time with a read in flight
    reads: float = 0.0  # reads issued
    wall_s: float = 0.0  # the steps' wall time

    def scale(self, f: float) -> None:
        for a in attrs.fields(Costs):
            setattr(self, a.name, getattr(self, a.name) * f)

    @property
    def read_s(self) -> float:
        """Reader time per read (busy time over reads: parallel reads share it)."""
        return self.busy_s / self.reads if self.reads else 0.0

    @property
    def stall_s(self) -> float:
        """Blocked time per demand read: what a prefetch hit saves (the prior: one read)."""
        return (self.wait_s + PRIOR * self.read_s) / (self.demand + PRIOR)

    @property
    def waste_s(self) -> float:
        """What a wasted prefetch costs compute: its reader time, in the share of the time
        the readers are busy (an idle reader's wasted read delays nothing)."""
        busy = min(1.0, self.busy_s / self.wall_s) if self.wall_s > 0 else 0.0
        return self.read_s * busy


def best_width(rates: list[float], stall_s: float, waste_s: float, cap: int, top_k: int) -> int:
    """The prefix of ranks, at most `cap`, whose expected saving (hit rate x stall) less
    expected waste ((1 - hit rate) x waste) sums highest; ties: the narrower. A rank above
    `top_k` takes a spare slot, which otherwise keeps an expert read earlier (a hit for
    free when it comes back): its miss also costs that expert's next read, one stall."""
    best, gain, total = 0, 0.0, 0.0
    for r, p in enumerate(rates[:cap]):
        waste = waste_s + (stall_s if r >= top_k else 0.0)
        total += p * stall_s - (1.0 - p) * waste
        if total > gain + 1e-12:
            best, gain = r + 1, total
    return best


class Width:
    """The engine's prefetch width in hint. Fixed (`fixed`), or auto: one step in `sample`
    the predictor ranks `ranks` experts and the next step's true routing scores each rank
    (the other steps predict the `now` best, in no order, as a fixed width would); the
    decode steps' read counters give the costs, and every `every` steps the width is
    re-decided (K until `min_samples` predictions are scored; above K only up to `room`)."""

    def __init__(
        self,
        top_k: int,
        n_experts: int,
        fixed: int | None,
        room: int,
        every: int = EVERY,
        min_samples: int = MIN_SAMPLES,
        sample: int = SAMPLE,
    ) -> None:
        self.top_k = top_k
        self.fixed = None if fixed is None else min(fixed, n_experts)
        self.auto = fixed is None
        self.ranks = min(n_experts, 2 * top_k) if self.auto else self.fixed or top_k
        self.cap = min(self.ranks, max(top_k, room))
        self.room = room
        self.now = self.fixed or top_k  # the width in use
        self.every = every
        self.min_samples = min_samples
        self.sample = sample
        self.hits = [0.0] * self.ranks  # per rank: predictions in the true top-K
        self.samples = 0.0  # scored predictions
        self.costs = Costs()
        self.steps = 0  # decode steps since the last decision
        self.decisions = 0
        self._last: tuple[float, float, float] | None = None  # demand, busy_s, issued
        self._step = -2  # the last decode step counted

    def scoring(self, step: int) -> bool:
        """Whether `step`'s predictions are ranked and scored (auto only)."""
        return self.auto and step % self.sample == 0

    def ask(self, step: int) -> tuple[int, bool]:
        """How many experts `step` asks the predictor for, and whether ranked (0: none)."""
        if self.scoring(step):
            return self.ranks, True
        return self.now, False

    def label(self) -> str:
        return f"auto: {self.now}" if self.auto else str(self.now)

    def observe(self, ranked: list[int], true: list[int]) -> None:
        """A prediction, best first, against the true top-K it was made for."""
        if not self.auto:
            return
        want = set(true)
        for r, e in enumerate(ranked[: self.ranks]):
            if e in want:
                self.hits[r] += 1
        self.samples += 1

    def step(
        self, step: int, wait_s: float, wall_s: float, demand: int, busy_s: float, issued: int
    ) -> None:
        """Decode step `step` ended: its blocked and wall time, and the scheduler's cumulative
        counters (demand reads, reader busy seconds, reads issued); the counters' changes
        count only from the decode step just before (not over a prompt between them)."""
        if not self.auto:
            return
        last, self._last = self._last, (float(demand), busy_s, float(issued))
        follows, self._step = self._step == step - 1, step
        if last is None or not follows:
            return
        c = self.costs
        c.wait_s += wait_s
        c.wall_s += wall_s
        c.demand += demand - last[0]
        c.busy_s += busy_s - last[1]
        c.reads += issued - last[2]
        self.steps += 1
        if self.steps >= self.every and self.samples >= self.min_samples:
            self.decide()

    def rates(self) -> list[float]:
        return [h / self.samples if self.samples else 0.0 for h in self.hits]

    def decide(self) -> int:
        """Re-decide the width from the measurements, log the decision, decay them."""
        rates, c = self.rates(), self.costs
        stall, waste = c.stall_s, c.waste_s
        self.now = best_width(rates, stall, waste, self.cap, self.top_k)
        self.decisions += 1
        log.info(
            "prefetch_width",
            width=self.now,
            top_k=self.top_k,
            room=self.room,
            hit_rates=[round(p, 3) for p in rates],
            stall_ms=round(stall * 1e3, 4),
            waste_ms=round(waste * 1e3, 4),
            read_ms=round(c.read_s * 1e3, 4),
            demand_reads=round(c.demand, 1),
        )
        for i in range(self.ranks):
            self.hits[i] *= DECAY
        self.samples *= DECAY
        c.scale(DECAY)
        self.steps = 0
        return self.now
