"""End-of-run summary of a streamed generation: speed, blocked load, overhead, reads, overlap."""

from __future__ import annotations

from typing import Any

import attrs

from edge0.runtime.compute.steps import StepRecord
from edge0.runtime.io.scheduler import ReadStats
from edge0.stats import speed_line

_MIB = 1 << 20


@attrs.define
class RunStats:
    """What one request (or a run so far) did. Times in seconds unless named _ms."""

    mode: str = ""
    exactness: str = ""  # "exact", or "approximate (route, agreement X%)" (routing.validation)
    top_k: int = 0
    predictor: str = ""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0  # forward passes after prefill (the first token comes from prefill)
    blocked_ms_per_step: float = 0.0  # decode steps: compute waiting on reads
    compute_ms_per_step: float = 0.0  # decode steps: inside mx.eval
    overhead_ms_per_layer: float = 0.0  # neither eval nor waiting, per streamed layer
    overhead_cpu_ms_per_layer: float = 0.0  # the same in compute-thread CPU time (load-proof)
    syncs_per_token: float = 0.0  # decode steps: host syncs (evaluations compute waited for)
    bytes_per_token: float = 0.0
    decode_bytes_per_step: float = 0.0  # read during decode steps only
    prefill_chunk: int = 1  # prompt tokens per forward
    prefill_bytes_per_token: float = 0.0  # read during prefill / prompt tokens
    first_decode_blocked_ms: float = 0.0  # the first decode step waiting on reads
    prefill_blocked_ms: float = 0.0  # the whole prefill waiting on reads
    slot_hit_rate: float = 0.0  # experts found staged (or in flight) when compute asked
    rewrites_per_step: float = 0.0  # slots written per step (incremental table: misses only)
    tier_reads: dict[str, int] = attrs.field(factory=dict)  # serving tier -> reads
    cache_hit_rate: float = 0.0  # reads served by a cache tier / all reads
    overlap_efficiency: float = 0.0  # max(compute, io) / measured decode time
    tickets_issued: int = 0
    tickets_consumed: int = 0
    tickets_wasted: int = 0
    tickets_cancelled: int = 0
    tickets_failed: int = 0
    peak_mlx_bytes: int = 0
    peak_rss_bytes: int = 0
    loop_max_lag_ms: float = 0.0
    loop_p99_lag_ms: float = 0.0
    finish_reason: str = ""  # stop | length | error | cancelled
    route_policy: str = ""  # route mode: predicted | available-first | deadline
    recall_hits: int = 0  # decode, routed layers whose true top-K was read back: true experts run
    recall_slots: int = 0  # ... out of this many (K per such layer-step)
    lead_reads: int = 0  # reads the deadline policy started one layer ahead
    prefetch_width: int | None = None  # hint: predicted experts prefetched per layer at the end
    prefetch_auto: bool = False  # ... chosen by measurement (--prefetch-width auto)

    @property
    def route_recall(self) -> float | None:
        """Share of the true top-K that routed layers ran (None: the true sets were not read)."""
        return self.recall_hits / self.recall_slots if self.recall_slots else None

    @property
    def decode_tps(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["decode_tps"], d["prefill_tps"] = self.decode_tps, self.prefill_tps
        d["route_recall"] = self.route_recall
        return d

    def line(self) -> str:
        """The one line `edge0 run` prints by default: the speed line, then reads and waits."""
        return (
            speed_line(
                self.prompt_tokens,
                self.prefill_tps,
                self.generated_tokens,
                self.decode_tps,
                self.peak_mlx_bytes,
                self.peak_rss_bytes,
            )
            + f" | reads: {self.bytes_per_token / _MIB:.2f} MiB/token"
            f" | blocked: {self.blocked_ms_per_step:.1f} ms/step"
            + (f" | {self.exactness}" if self.exactness else "")
        )

    def summary(self) -> str:
        """A few lines for people (`edge0 run` prints it to stderr); the first is the
        same stats line as the resident path."""
        tiers = ", ".join(f"{k}={v}" for k, v in sorted(self.tier_reads.items())) or "none"
        return "\n".join(
            [
                speed_line(
                    self.prompt_tokens,
                    self.prefill_tps,
                    self.generated_tokens,
                    self.decode_tps,
                    self.peak_mlx_bytes,
                    self.peak_rss_bytes,
                ),
                f"mode {self.mode}, {self.exactness or 'exact'} (top-k {self.top_k}, predictor "
                f"{self.predictor or '-'}{self._policy()}{self._width()}) | "
                f"blocked load {self.blocked_ms_per_step:.2f} ms/step | compute "
                f"{self.compute_ms_per_step:.2f} ms/step | scheduler overhead "
                f"{self.overhead_ms_per_layer:.3f} ms/layer ({self.overhead_cpu_ms_per_layer:.3f} "
                f"CPU) | host syncs {self.syncs_per_token:.1f}/token | overlap efficiency "
                f"{self.overlap_efficiency:.2f}",
                f"prefill: chunk {self.prefill_chunk}, reads "
                f"{self.prefill_bytes_per_token / _MIB:.2f} MiB/prompt token, blocked "
                f"{self.prefill_blocked_ms:.0f} ms | first decode step "
                f"blocked {self.first_decode_blocked_ms:.2f} ms",
                f"reads {self.bytes_per_token / _MIB:.2f} MiB/token | slot hit rate "
                f"{self.slot_hit_rate:.2f} | slot rewrites {self.rewrites_per_step:.1f}/step | "
                f"cache hit rate {self.cache_hit_rate:.2f} | "
                f"by tier: {tiers}",
                f"tickets issued {self.tickets_issued}, consumed {self.tickets_consumed}, wasted "
                f"{self.tickets_wasted}, cancelled {self.tickets_cancelled}, failed "
                f"{self.tickets_failed}",
                f"event-loop lag max {self.loop_max_lag_ms:.1f} ms, "
                f"p99 {self.loop_p99_lag_ms:.1f} ms",
            ]
        )

    def _width(self) -> str:
        if self.prefetch_width is None:
            return ""
        return f", prefetch width {self.prefetch_width}{' (auto)' if self.prefetch_auto else ''}"

    def _policy(self) -> str:
        if not self.route_policy:
            return ""
        recall = "" if self.route_recall is None else f", recall {self.route_recall:.2f}"
        return f", policy {self.route_policy}{recall}"


def diff_reads(after: ReadStats, before: ReadStats) -> ReadStats:
    """Counters of `after` minus `before` (per-request deltas of the cumulative stats)."""
    out = ReadStats()
    for f in attrs.fields(ReadStats):
        a, b = getattr(after, f.name), getattr(before, f.name)
        if isinstance(a, dict):
            setattr(out, f.name, {k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0)})
        else:
            setattr(out, f.name, a - b)
    return out


def fill(
    stats: RunStats,
    steps: list[StepRecord],
    reads: ReadStats,
    decode_io_s: float,
    decode_bytes: int = 0,
) -> None:
    """Derive the per-step figures from the decode steps and the read counters."""
    decode = [s for s in steps if not s.prefill]
    stats.prefill_blocked_ms = sum(s.wait for s in steps if s.prefill) * 1e3
    n = len(decode)
    if n:
        stats.decode_bytes_per_step = decode_bytes / n
        wall = sum(s.wall for s in decode)
        ev = sum(s.eval for s in decode)
        wait = sum(s.wait for s in decode)
        layers = sum(s.layers for s in decode)
        stats.blocked_ms_per_step = wait / n * 1e3
        stats.compute_ms_per_step = ev / n * 1e3
        stats.overhead_ms_per_layer = (wall - ev - wait) / layers * 1e3 if layers else 0.0
        cpu = sum(s.cpu - s.cpu_excluded for s in decode)
        stats.overhead_cpu_ms_per_layer = cpu / layers * 1e3 if layers else 0.0
        stats.syncs_per_token = sum(s.syncs for s in decode) / n
        stats.overlap_efficiency = max(ev, decode_io_s) / wall if wall > 0 else 0.0
        stats.first_decode_blocked_ms = decode[0].wait * 1e3
        stats.recall_hits = sum(s.recall_hits for s in decode)
        stats.recall_slots = sum(s.recall_slots for s in decode)
        stats.lead_reads = sum(s.lead_reads for s in decode)
    tokens = stats.prompt_tokens + stats.generated_tokens
    stats.bytes_per_token = reads.bytes / tokens if tokens else 0.0
    asked = reads.staged_hits + reads.staged_misses
    stats.slot_hit_rate = reads.staged_hits / asked if asked else 0.0
    stats.rewrites_per_step = reads.issued / len(steps) if steps else 0.0
    done = sum(reads.by_tier.values())
    stats.tier_reads = dict(reads.by_tier)
    stats.cache_hit_rate = reads.hits / done if done else 0.0
    stats.tickets_issued = reads.issued
    stats.tickets_consumed = reads.consumed
    stats.tickets_cancelled = reads.cancelled
    stats.tickets_failed = reads.failed
    stats.tickets_wasted = max(0, reads.issued - reads.consumed - reads.cancelled - reads.failed)
