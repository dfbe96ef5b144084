"""One request at a time: the engine's FIFO worker path (max_batch 1), and the prompt and stats
helpers that the batching worker shares.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from edge0.log import get_logger
from edge0.model.generate import Sampler
from edge0.runtime.compute.runner import Runner, greedy
from edge0.runtime.compute.steps import StepRecord
from edge0.runtime.engine.decoding import Decoding
from edge0.runtime.engine.host import Host
from edge0.runtime.engine.requests import Request
from edge0.runtime.engine.summary import RunStats, diff_reads, fill
from edge0.runtime.io.scheduler import ReadStats
from edge0.runtime.prefill.chunks import PromptCancelled, chunked_prefill
from edge0.stats import peak_mlx_bytes, peak_rss_bytes

log = get_logger("edge0.runtime.engine.api")


def chunk(runner: Any) -> int:
    """Prompt tokens per forward: a pipeline's rank 0 (edge0.ranks) feeds one token per step."""
    return runner.steps.prefill_chunk if isinstance(runner, Runner) else 1


def prefill(
    runner: Runner, ids: list[int], decode: bool, cancelled: Callable[[], bool] | None = None
) -> int:
    """Feed the prompt; only its last step draws (so a seed's first draw is the first token)
    and, when a decode step follows (`decode`), prefetches. `cancelled` (the request's flag)
    is read between steps and inside chunks: True raises PromptCancelled."""
    if chunk(runner) > 1 and len(ids) > 1:  # chunked: only the last chunk draws
        return chunked_prefill(runner, ids, chunk(runner), decode, cancelled)
    sampler, runner.sampler = runner.sampler, greedy
    try:
        for tok in ids[:-1]:  # Runner.prefill's steps, the flag read between two
            if cancelled is not None and cancelled():
                raise PromptCancelled
            runner.feed(tok, prefill=True, prefetch=False)
    finally:
        runner.sampler = sampler
    return runner.feed(ids[-1], prefill=True, prefetch=decode)


def pieces(runner: Any, n: int, join_chunk: int | None) -> list[tuple[int, int]]:
    """(start, end) of a joining prompt's pieces: the whole prompt (`join_chunk` None), or
    `join_chunk` tokens rounded up to whole prefill chunks (the chunks stay those of a solo
    run, so the prompt's forwards are the same)."""
    if join_chunk is None or n <= 1:
        return [(0, n)]
    c = chunk(runner)
    size = -(-join_chunk // c) * c
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def prefill_piece(
    runner: Runner,
    ids: list[int],
    start: int,
    end: int,
    decode: bool,
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """Feed `ids[start:end]`: the last piece as `prefill` (it draws and may prefetch), the
    others greedily and without prefetching (prompt steps follow them)."""
    if end == len(ids):
        return prefill(runner, ids[start:], decode, cancelled)
    sampler, runner.sampler = runner.sampler, greedy
    try:
        if chunk(runner) > 1 and end - start > 1:  # the same forwards as a solo run's
            return chunked_prefill(runner, ids[start:end], chunk(runner), False, cancelled)
        return runner.prefill(ids[start:end], decode=False)
    finally:
        runner.sampler = sampler


def reads_now(engine: Host) -> ReadStats | None:
    sched = engine.setup.reads
    return sched.counters() if sched else None


def new_stats(engine: Host, req: Request, runner: Any) -> RunStats:
    ctx = engine.setup.ctx
    policy = engine.options.route_policy if ctx.mode == "route" else ""
    stats = RunStats(
        mode=ctx.mode,
        exactness=engine.setup.exactness,
        top_k=ctx.top_k,
        prompt_tokens=len(req.ids),
        predictor=getattr(ctx.predictor, "name", ""),
        prefill_chunk=chunk(runner),
        route_policy=policy,
    )
    stats.finish_reason = "cancelled"
    return stats


async def run_request(engine: Host, req: Request) -> None:
    """One request's steps on the compute thread; tokens go to its queue as they come."""
    ctx, sched, compute = engine.setup.ctx, engine.setup.reads, engine._compute
    settings = req.settings
    runner = await compute.run(  # the sampler is seeded on this thread
        lambda: engine.setup.make_runner(req.id, Sampler(settings), settings)
    )
    first_record = len(ctx.records)
    reads0 = reads_now(engine)
    await compute.run(mx.reset_peak_memory)
    engine._lags = []
    stats = new_stats(engine, req, runner)
    t0 = time.perf_counter()
    io_at_decode: float | None = None
    bytes_at_decode: int | None = None
    try:
        try:
            tok = await compute.run(
                lambda: prefill(runner, req.ids, req.max_tokens > 1, lambda: req.cancelled)
            )
        except PromptCancelled:
            return  # stopped inside its prompt: finish_reason stays "cancelled"
        t1 = time.perf_counter()
        stats.prefill_s = t1 - t0
        if sched is not None and reads0 is not None:
            io_at_decode, bytes_at_decode = t1, sched.stats.bytes
            stats.prefill_bytes_per_token = (bytes_at_decode - reads0.bytes) / len(req.ids)
        decoding = Decoding(req, stats, t1)
        decoding.take(tok, step=False)  # the prompt's last step drew the first token
        if not decoding.done:  # the decode steps back to back on the compute thread
            job = functools.partial(decoding.steps, runner, tok, asyncio.get_running_loop())
            try:
                await compute.run(job)
            except asyncio.CancelledError:  # the engine is closing: stop after the step
                decoding.halt = decoding.done = True
                raise
        stats.decode_s = time.perf_counter() - t1
    except Exception:
        stats.finish_reason = "error"
        raise
    finally:
        compute.submit(runner.finish)  # after its last step: cancel queued prefetches
        req.stats = stats
        decode_io, decode_bytes = 0.0, 0
        if sched is not None and io_at_decode is not None and bytes_at_decode is not None:
            decode_io = sched.io_time(io_at_decode, time.perf_counter())
            decode_bytes = sched.stats.bytes - bytes_at_decode
        finish_stats(engine, stats, ctx.records[first_record:], reads0, decode_io, decode_bytes)


def finish_stats(
    engine: Host,
    stats: RunStats,
    records: list[StepRecord],
    reads0: ReadStats | None,
    decode_io: float,
    decode_bytes: float,
) -> None:
    """Fill a finished request's stats from its step records and read counters; log them."""
    sched = engine.setup.reads
    reads = diff_reads(sched.counters(), reads0) if sched and reads0 else ReadStats()
    fill(stats, records, reads, decode_io, int(decode_bytes))
    width = engine.setup.ctx.width
    if width is not None:
        stats.prefetch_width, stats.prefetch_auto = width.now, width.auto
    stats.peak_mlx_bytes = peak_mlx_bytes()
    stats.peak_rss_bytes = peak_rss_bytes()
    lags = sorted(engine._lags) or [0.0]
    stats.loop_max_lag_ms = lags[-1] * 1e3
    stats.loop_p99_lag_ms = lags[int(0.99 * (len(lags) - 1))] * 1e3
    engine.last_stats = stats
    log.info("request_done", **{k: v for k, v in stats.to_dict().items() if k != "tier_reads"})
