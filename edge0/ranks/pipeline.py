"""One rank's share of a request: its layers for each step, the messages to its neighbours, the
predicted expert sets sent on with the hidden state (docs/distributed.md).
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import numpy as np

from edge0.errors import ConfigError
from edge0.log import get_logger
from edge0.model.generate import Sampler, SamplingSettings
from edge0.model.sparse import sparse_blocks
from edge0.ranks.link import (
    BEGIN,
    GREEDY,
    PING,
    STATS,
    STEP,
    STOP,
    TOKEN,
    Link,
    Message,
    hidden_words,
    pack_floats,
    unpack_floats,
    words_hidden,
)
from edge0.ranks.stage import Stage
from edge0.runtime.compute.runner import greedy
from edge0.runtime.compute.steps import Steps
from edge0.runtime.io.fetcher import Fetcher
from edge0.runtime.io.planner import Planner
from edge0.runtime.io.scheduler import Scheduler
from edge0.runtime.io.slotmem import SlotMemory
from edge0.runtime.io.slots import SlotPool
from edge0.runtime.io.table import SlotTable
from edge0.runtime.io.trace import Tracer
from edge0.stats import peak_rss_bytes
from edge0.storage.tier import Tier

log = get_logger("edge0.ranks.pipeline")
# per rank in a STATS message (the latest request): compute-thread wall and CPU time of its
# steps, time inside mx.eval, time blocked on reads, expert reads; then the rank's slot pool,
# the bytes it read while loading (-1: unknown) and the lowest / highest layer whose experts
# it has read (-1: none); last, the number and wall time of its decode steps alone (the
# steps after the prompt: a token's time minus every rank's decode step is the ring's share)
STAT_NAMES = (
    "rank",
    "peak_rss_mib",
    "steps",
    "wall_s",
    "cpu_s",
    "eval_s",
    "wait_s",
    "read_mib",
    "reads",
    "slots",
    "load_read_mib",
    "read_layer_min",
    "read_layer_max",
    "decode_steps",
    "decode_wall_s",
)
STAT_WORDS = len(STAT_NAMES)


class StageScheduler(Scheduler):
    """A scheduler whose prefetches for another rank's layer go to the outbox, not to a tier."""

    def __init__(
        self, slots: SlotTable, fetcher: Fetcher, planner: Planner, remote: set[int]
    ) -> None:
        super().__init__(slots, fetcher, planner)
        self.remote = remote
        self.outbox: dict[int, tuple[int, list[int]]] = {}  # layer -> (step, experts)

    @classmethod
    def build(
        cls,
        tier: Tier,
        memory: SlotMemory,
        pool: SlotPool,
        tracer: Tracer,
        workers: int,
        remote: set[int],
    ) -> StageScheduler:
        """This rank's scheduler (`build_scheduler`'s parts); `remote`: the other ranks' layers."""
        table = SlotTable(pool, memory)
        fetcher = Fetcher(table, tier, tracer, workers)
        return cls(table, fetcher, Planner(table.lock, fetcher.post), remote)

    @property
    def read_layers(self) -> set[int]:
        """Layers whose experts this rank has read."""
        return self.fetcher.layers_read

    def _prefetch(self, layer: int, step: int, experts: list[int]) -> int:
        if layer in self.remote:
            self.outbox[layer] = (step, list(experts))
            return 0
        return super()._prefetch(layer, step, experts)


def inject(steps: Steps, layer: int, experts: list[int]) -> None:
    """A prediction from the previous rank for `layer` at the next step: plan and prefetch it."""
    step = steps.step + 1
    stream: Any = steps.layers[layer]
    stream.offer(step, experts)
    assert steps.scheduler is not None
    steps.scheduler.prefetch(layer, step, experts)


class StageRunner:
    """This rank's part of one request: its caches and one step of its layers."""

    def __init__(
        self, stage: Stage, ctx: Steps, request: int, entry: int | None, exit_to: int | None
    ) -> None:
        self.stage = stage
        self.ctx = ctx
        self.entry = entry  # this rank's first streamed layer (receives predictions), or None
        self.exit_to = exit_to  # the remote layer this rank's last head predicts, or None
        self.cache = stage.make_cache()
        # streaming layers count themselves; with none (resident mode) every sparse layer runs
        self.uncounted = 0 if ctx.layers else len(sparse_blocks(stage.model))
        sched = ctx.scheduler
        self.reads0 = (sched.stats.bytes, sched.stats.issued) if sched is not None else (0, 0)
        ctx.begin_request(request)
        self.first_record = len(ctx.records)

    def step(
        self, x: mx.array, prefill: bool, pred: list[int] | None, prefetch: bool = True
    ) -> mx.array:
        """Run this rank's layers on `x` for the next step; the output is evaluated."""
        ctx = self.ctx
        t0, c0 = time.perf_counter(), time.thread_time()
        ctx.begin_step(prefill, prefetch)
        if pred is not None and self.entry is not None:
            inject(ctx, self.entry, pred)
        out = self.stage.forward(x, self.cache)
        ctx.fence(out)  # the step fence of this rank (an eval span; deferred syncs included)
        t2, c2 = time.perf_counter(), time.thread_time()
        ctx.cur.cpu = c2 - c0
        ctx.cur.layers += self.uncounted
        ctx.end_step(t2 - t0)
        return out

    def outgoing(self) -> list[int] | None:
        """The prediction this step made for the next rank's first layer (next step)."""
        sched = self.ctx.scheduler
        if self.exit_to is None or not isinstance(sched, StageScheduler):
            return None
        got = sched.outbox.pop(self.exit_to, None)
        return None if got is None or got[0] != self.ctx.step + 1 else got[1]

    def stats(self, node: Any) -> list[float]:
        recs = self.ctx.records[self.first_record :]
        decode = [r for r in recs if not r.prefill]
        sched = self.ctx.scheduler
        b, n = (sched.stats.bytes, sched.stats.issued) if sched is not None else (0, 0)
        read = sorted(getattr(sched, "read_layers", ())) or [-1]
        loaded = node.load_read / 2**20 if node.load_read >= 0 else -1.0
        return [
            float(node.rank),
            peak_rss_bytes() / 2**20,
            len(recs),
            sum(r.wall for r in recs),
            sum(r.cpu for r in recs),
            sum(r.eval for r in recs),
            sum(r.wait for r in recs),
            (b - self.reads0[0]) / 2**20,
            float(n - self.reads0[1]),
            float(node.n_slots),
            loaded,
            float(read[0]),
            float(read[-1]),
            float(len(decode)),
            sum(r.wall for r in decode),
        ]


def settings_words(s: SamplingSettings) -> np.ndarray:
    seed = -1.0 if s.seed is None else float(s.seed)
    return pack_floats([s.temp, s.top_p, float(s.top_k), s.min_p, seed])


def words_settings(words: np.ndarray) -> SamplingSettings:
    temp, top_p, top_k, min_p, seed = unpack_floats(words, 5)
    return SamplingSettings(
        temp=temp, top_p=top_p, top_k=int(top_k), min_p=min_p, seed=None if seed < 0 else int(seed)
    )


class PipelineRunner:
    """Rank 0's Runner: the same `prefill` / `feed` as edge0.runtime.compute.runner.Runner."""

    def __init__(self, node: Any, request: int, sampler: Any, settings: SamplingSettings) -> None:
        self.node = node
        self.sampler = sampler  # the Engine swaps in `greedy` for prompt steps that do not draw
        self.link: Link = node.link
        self.request = request
        self.part = StageRunner(node.stage, node.ctx, request, node.entry, node.exit_to)
        node.part = self.part
        self.link.send(
            1,
            Message(BEGIN, request, payload=settings_words(settings)),
            "rank 0: starting a request on rank 1",
        )
        self.wrap: list[int] | None = None

    def feed(self, token: int, prefill: bool, prefetch: bool = True) -> int:
        part, link, size = self.part, self.link, self.node.size
        if self.wrap is not None and self.node.wrap_to is not None:
            inject(part.ctx, self.node.wrap_to, self.wrap)  # last rank's head -> our first layer
        h = part.step(mx.array([[token]]), prefill, None, prefetch)
        m = Message(
            STEP,
            self.request,
            part.ctx.step,
            part.ctx.pos,
            prefill,
            pred=part.outgoing(),
            payload=hidden_words(h),
            flags=GREEDY if self.sampler is greedy else 0,
        )
        link.send(1, m, f"rank 0: sending step {m.step} to rank 1")
        back = link.recv(
            size - 1, f"rank 0: waiting for the token of step {m.step} from rank {size - 1}"
        )
        self.wrap = back.pred
        return back.token

    def prefill(self, tokens: list[int], decode: bool = True) -> int:
        nxt = -1
        for i, tok in enumerate(tokens):
            nxt = self.feed(tok, prefill=True, prefetch=decode and i == len(tokens) - 1)
        return nxt

    def finish(self) -> None:
        """The request ended: rank 0's queued prefetches are cancelled."""
        self.part.ctx.end_request()


def gather_stats(node: Any) -> list[dict[str, float]]:
    """Rank 0: every rank's stats for the latest request (one trip around the ring)."""
    words = np.zeros(node.link.codec.words, dtype=np.int32)
    if node.size * STAT_WORDS > words.size:
        raise ConfigError(f"per-rank stats of {node.size} ranks do not fit one message")
    if node.part is not None:
        words[:STAT_WORDS] = pack_floats(node.part.stats(node))
    node.link.send(1, Message(STATS, payload=words), "rank 0: asking for rank stats")
    back = node.link.recv(node.size - 1, "rank 0: waiting for rank stats")
    assert back.payload is not None
    rows = [unpack_floats(back.payload[r * STAT_WORDS :], STAT_WORDS) for r in range(node.size)]
    return [dict(zip(STAT_NAMES, row, strict=True)) for row in rows]


def ping(node: Any, n: int) -> list[float]:
    """Rank 0: `n` empty trips around the ring; seconds per trip."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        node.link.send(1, Message(PING), "rank 0: ping")
        node.link.recv(node.size - 1, "rank 0: ping")
        out.append(time.perf_counter() - t0)
    return out


def serve(node: Any) -> None:
    """Rank > 0: run steps as they arrive until rank 0 sends STOP (on the compute thread)."""
    link, rank, size = node.link, node.rank, node.size
    nxt, prev = (rank + 1) % size, rank - 1
    last = rank == size - 1
    part: StageRunner | None = None
    sampler: Any = None
    while True:
        m = link.recv(prev, f"rank {rank}: waiting for rank {prev}", timeout=None)
        if m.kind == BEGIN:
            part = StageRunner(node.stage, node.ctx, m.request, node.entry, node.exit_to)
            sampler = Sampler(words_settings(m.payload))  # seeded here, as on one machine
            if not last:
                link.send(nxt, m, f"rank {rank}: passing a request to rank {nxt}")
        elif m.kind == STEP:
            assert part is not None and m.payload is not None
            x = words_hidden(m.payload, node.d_model, node.dtype)
            out = part.step(x, m.prefill, m.pred)
            if last:
                tok = (greedy if m.flags & GREEDY else sampler)(out[:, -1, :])
                mx.eval(tok)
                token: int = tok.item()  # type: ignore[assignment]
                back = Message(TOKEN, m.request, m.step, token=token, pred=part.outgoing())
                link.send(0, back, f"rank {rank}: returning the token of step {m.step}")
            else:
                fwd = Message(
                    STEP,
                    m.request,
                    m.step,
                    m.pos,
                    m.prefill,
                    pred=part.outgoing(),
                    payload=hidden_words(out),
                    flags=m.flags,
                )
                link.send(nxt, fwd, f"rank {rank}: sending step {m.step} to rank {nxt}")
        elif m.kind == STATS:
            assert m.payload is not None
            if part is not None:
                m.payload[rank * STAT_WORDS : (rank + 1) * STAT_WORDS] = pack_floats(
                    part.stats(node)
                )
            link.send(nxt, m, f"rank {rank}: passing stats to rank {nxt}")
        elif m.kind in (PING, STOP):
            link.send(nxt, m, f"rank {rank}: passing a message to rank {nxt}")
            if m.kind == STOP:
                log.info("rank_stopped", rank=rank)
                return
