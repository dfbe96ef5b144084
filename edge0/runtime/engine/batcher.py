"""Continuous batching on the event loop: up to `max_batch` requests decode together, a token each
(docs/runtime.md, "Batched decode": joins and leaves, paused consumers, isolation).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

import attrs

from edge0.model.generate import Sampler
from edge0.runtime.compute.batch import (
    BatchStep,
    RowState,
    export_state,
    import_state,
    prefetch_plans,
)
from edge0.runtime.compute.steps import StepRecord
from edge0.runtime.engine.host import Host
from edge0.runtime.engine.requests import EngineClosedError, Request
from edge0.runtime.engine.solo import (
    finish_stats,
    new_stats,
    pieces,
    prefill_piece,
    reads_now,
)
from edge0.runtime.engine.summary import RunStats
from edge0.runtime.io.scheduler import ReadStats
from edge0.runtime.prefill.chunks import PromptCancelled


@attrs.define
class StepLog:
    """One decode step of the worker: how many requests it fed, its time and its reads."""

    rows: int
    wall: float
    wait: float  # blocked on reads
    eval: float  # in mx.eval (MLX compute)
    bytes: int
    cpu: float = 0.0  # process CPU time over the step, every thread (compute, MLX, tiers)


@attrs.define(eq=False)
class Active:
    """A request between its prompt and its end."""

    req: Request
    row: RowState
    stats: RunStats
    reads0: ReadStats | None
    records: list[StepRecord]
    tok: int = -1  # the token the next step feeds
    n: int = 0  # tokens generated
    t_decode: float = 0.0
    decode_bytes: float = 0.0  # its share of the bytes read in its decode steps


class Batcher:
    """The batching worker of one engine (`Engine._serve` runs `serve`)."""

    def __init__(self, engine: Host) -> None:
        self.engine = engine
        self.max_batch = engine.options.max_batch
        self.buffer = engine.options.token_buffer
        self.active: list[Active] = []
        self.solo: RowState | None = None  # whose state the layer streams hold
        self.wake = asyncio.Event()
        self.log: list[StepLog] = []  # decode steps (the batch bench reads it)
        self._last: list[Active] = []
        self._step = BatchStep(engine.setup.ctx, engine.setup.model)

    def notify(self) -> None:
        """A request arrived, or a consumer pulled or went away."""
        self.wake.set()

    async def serve(self) -> None:
        try:
            while True:
                for a in [a for a in self.active if a.req.cancelled]:
                    await self._leave(a)
                await self._admit()
                runnable = [a for a in self.active if a.req.backlog < self.buffer]
                if runnable:
                    await self._decode(runnable)
                    continue
                # nothing to run (all paused, or none) and nobody can join: wait for a
                # consumer to pull or go away, or for a request (no wake-up is lost: nothing
                # else runs between these lines)
                if not self.active and self.engine._pending.empty():
                    self.engine._idle.set()
                self.wake.clear()
                await self.wake.wait()
        except asyncio.CancelledError:
            for a in self.active:
                a.req.finish(EngineClosedError("the engine closed during this request"))
            raise

    async def _admit(self) -> None:
        eng = self.engine
        while len(self.active) < self.max_batch and not eng._pending.empty():
            req = eng._pending.get_nowait()
            eng._idle.clear()
            if req.cancelled:
                req.finish()
                continue
            req.state, req.on_pull = "running", self.notify
            await self._join(req)

    async def _join(self, req: Request) -> None:
        """The request's prompt, as its own steps; then it is active (or already done).

        With `join_chunk`, the prompt runs in pieces and the running requests decode one
        step between two pieces (they wait one piece, not the whole prompt)."""
        eng = self.engine
        ctx, compute, settings = eng.setup.ctx, eng._compute, req.settings
        others = bool(self.active)
        await self._to_rows()

        def start() -> Any:
            if others:  # a fresh step: the others' prefetched slots may serve the prompt
                ctx.step += 1
            return eng.setup.make_runner(req.id, Sampler(settings), settings)

        runner = await compute.run(start)
        row = RowState(runner, req.id)
        stats = new_stats(eng, req, runner)
        reads0 = reads_now(eng)
        if not others:
            eng._lags = []
        t0 = time.perf_counter()
        a = Active(req, row, stats, reads0, [])
        decode = req.max_tokens > 1
        parts = pieces(runner, len(req.ids), eng.options.join_chunk if others else None)
        prompt_bytes, fed = 0, 0
        try:
            for lo, hi in parts:
                if lo > 0 and not await self._between_pieces(row, req):
                    break  # cancelled while its prompt ran
                n0, b0 = len(ctx.records), self._bytes()
                a.tok = await compute.run(
                    partial(prefill_piece, runner, req.ids, lo, hi, decode, lambda: req.cancelled)
                )
                a.records += ctx.records[n0:]  # the prompt's steps (not the others' between)
                prompt_bytes, fed = prompt_bytes + self._bytes() - b0, hi
                self.solo = row
        except PromptCancelled:  # inside a piece: finish_reason stays "cancelled"
            self.solo = None
            if not self.active:  # nobody uses its queued prefetches
                await compute.run(runner.finish)
            await self._end(a, None)
            return
        except Exception as exc:  # noqa: BLE001 - this request's error, not the engine's
            stats.finish_reason = "error"
            self.solo = None
            await self._end(a, exc)
            return
        if fed < len(req.ids):  # cancelled between two pieces
            self.solo = None
            await self._end(a, None)
            return
        a.t_decode = time.perf_counter()
        stats.prefill_s = a.t_decode - t0
        if reads0 is not None:
            stats.prefill_bytes_per_token = prompt_bytes / len(req.ids)
        self.active.append(a)
        if not self._emit(a, a.tok):
            await self._leave(a)

    async def _between_pieces(self, row: RowState, req: Request) -> bool:
        """One decode step of the running requests between two pieces of a joining prompt;
        then the joining request's state back in the streams. False: it was cancelled."""
        for a in [a for a in self.active if a.req.cancelled]:
            await self._leave(a)
        runnable = [a for a in self.active if a.req.backlog < self.buffer]
        if runnable:
            self._last = []  # the piece moved slots: stage the rows' plans again
            await self._decode(runnable)
        if self.solo is not row:
            await self._to_rows()
            ctx = self.engine.setup.ctx

            def back() -> None:
                ctx.step += 1  # a fresh step, as for the first piece
                import_state(ctx, row)

            await self.engine._compute.run(back)
            self.solo = row
        return not req.cancelled

    def _bytes(self) -> int:
        sched = self.engine.setup.reads
        return sched.stats.bytes if sched is not None else 0

    async def _to_rows(self) -> None:
        """The streams' request state (one that ran alone) goes back into its row."""
        if self.solo is not None:
            solo, self.solo = self.solo, None
            await self.engine._compute.run(lambda: export_state(self.engine.setup.ctx, solo))

    def _emit(self, a: Active, tok: int) -> bool:
        """Hand `tok` on; False when the request ends with it."""
        req, stats = a.req, a.stats
        if tok in req.eos:
            stats.finish_reason = "stop"
            return False
        a.n, a.tok = a.n + 1, tok
        stats.generated_tokens = a.n
        req.put(tok)
        if a.n >= req.max_tokens:
            stats.finish_reason = "length"
            return False
        a.row.more = a.n + 1 < req.max_tokens  # else no prefetch: no step uses it
        return not req.cancelled

    async def _decode(self, runnable: list[Active]) -> None:
        """One decode step of the runnable requests."""
        eng = self.engine
        ctx, sched, compute = eng.setup.ctx, eng.setup.reads, eng._compute
        rows = [a.row for a in runnable]
        bytes0 = sched.stats.bytes if sched is not None else 0
        cpu0 = time.process_time()
        toks: list[int | None]
        ran = True  # the step reached its end (its record is the last one)
        if len(runnable) == 1:
            a = runnable[0]
            if self.solo is not a.row:
                await self._to_rows()

                def alone() -> None:
                    self._step.unstack()  # its cache back from a stacked batch
                    import_state(ctx, a.row)

                await compute.run(alone)
                self.solo = a.row
            try:
                toks = [await compute.run(lambda: a.row.runner.feed(a.tok, False, a.row.more))]
            except Exception as exc:  # noqa: BLE001 - this request's error
                a.row.error, toks, ran = exc, [None], False
        else:
            await self._to_rows()
            replan = runnable != self._last

            def step() -> list[int | None]:
                if replan:  # a prompt ran or a request came back: its slots may be gone
                    prefetch_plans(ctx, rows)
                return self._step.run(rows, [a.tok for a in runnable])

            try:
                toks = await compute.run(step)
            except Exception as exc:  # noqa: BLE001 - the step's error ends its requests only
                for row in rows:
                    row.error = exc
                toks, ran = [None] * len(rows), False
        self._last = runnable
        rec = ctx.records[-1] if ran and ctx.records else StepRecord(-1, False)
        read = (sched.stats.bytes if sched is not None else 0) - bytes0
        cpu = time.process_time() - cpu0
        self.log.append(StepLog(len(runnable), rec.wall, rec.wait, rec.eval, read, cpu))
        for a, tok in zip(runnable, toks, strict=True):
            a.records.append(rec)
            a.stats.decode_steps += 1
            a.decode_bytes += read / len(runnable)
            a.stats.decode_s = time.perf_counter() - a.t_decode
            if tok is None:
                a.stats.finish_reason = "error"
                await self._leave(a, a.row.error)
            elif not self._emit(a, tok):
                await self._leave(a)

    async def _leave(self, a: Active, error: BaseException | None = None) -> None:
        self.active.remove(a)
        if self.solo is a.row:
            self.solo = None
        a.stats.decode_s = time.perf_counter() - a.t_decode
        if not self.active:  # nobody uses the queued prefetches (nor a stacked cache) any more
            step, runner = self._step, a.row.runner

            def finish() -> None:
                step.stack.drop()
                runner.finish()

            await self.engine._compute.run(finish)
        await self._end(a, error)

    async def _end(self, a: Active, error: BaseException | None) -> None:
        eng, stats = self.engine, a.stats
        sched = eng.setup.reads
        decode_io = sched.io_time(a.t_decode, time.perf_counter()) if sched and a.t_decode else 0
        a.req.stats = stats
        finish_stats(eng, stats, a.records, a.reads0, decode_io, a.decode_bytes)
        tokens = stats.prompt_tokens + stats.generated_tokens
        if sched is not None and tokens:  # its own prompt's reads and its share of the steps'
            stats.bytes_per_token = (
                stats.prefill_bytes_per_token * stats.prompt_tokens + a.decode_bytes
            ) / tokens
        a.req.finish(error)
