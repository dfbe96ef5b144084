"""The async API: `async with Engine.open(path) as eng:`, then `async for p in eng.generate(...)`.

One engine owns one model, one compute thread, one tier stack and one scheduler.
Requests are served FIFO (an asyncio.Lock queues them); a caller that stops
iterating or is cancelled releases the engine at once (a step already running on
the compute thread finishes first, in order). A tier error ends that request with
the error; the next request runs normally. `SyncEngine` wraps it for plain code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import structlog

from edge0 import log as edge0_log
from edge0.errors import PromptError
from edge0.log import get_logger
from edge0.model.generate import SamplingSettings, encode_prompt
from edge0.runtime.runner import Runner
from edge0.runtime.scheduler import ComputeThread, ReadStats
from edge0.runtime.setup import EngineOptions, Setup, build
from edge0.runtime.stats import peak_mlx_bytes, peak_rss_bytes
from edge0.runtime.summary import RunStats, diff_reads, fill

log = get_logger("edge0.runtime.engine")
HEARTBEAT_S = 0.005


class Engine:
    """A loaded model ready to stream; create it with `Engine.open`."""

    def __init__(self, setup: Setup, compute: ComputeThread) -> None:
        self.setup = setup
        self.options = setup.options
        self.tokenizer = setup.tokenizer
        self._compute = compute
        self._fifo = asyncio.Lock()
        self._ids = itertools.count(1)
        self._lags: list[float] = []
        self._heartbeat: asyncio.Task[None] | None = None
        self.last_stats: RunStats | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, path: str | Path, **options: Any) -> AsyncIterator[Engine]:
        """Load `path` (an edge0-layout directory) and start the runtime.

        Options (see EngineOptions): tiers="ram:1GiB>pread" (or a Tier object),
        mode="route" (resident, reactive, hint, route), top_k=None (the model's),
        predictor=None (heads when prerouter.safetensors exists, else init; or
        oracle, temporal), memory_budget=None ("3GiB"), trace=None (a .json path),
        first_layer="resident" (or "wrap", "reactive"), io_workers=2.
        """
        if not structlog.is_configured():  # a library stays quiet unless the app configures logs
            edge0_log.configure("warning")
        opts = EngineOptions(**options)
        compute = ComputeThread()
        try:
            setup = await build(Path(path), opts, compute)
        except BaseException:
            compute.close()
            raise
        engine = cls(setup, compute)
        try:
            await engine._start()
            yield engine
        finally:
            await engine._close()

    async def _start(self) -> None:
        if self.setup.scheduler is not None:
            await self.setup.scheduler.start()
        self._heartbeat = asyncio.create_task(self._beat(), name="edge0-heartbeat")

    async def _close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if self.setup.scheduler is not None:
            await self.setup.scheduler.aclose()
        if self.setup.tier is not None:
            await self.setup.tier.aclose()
        if self.options.trace:
            self.setup.tracer.write_chrome(self.options.trace)
        self._compute.close()

    async def _beat(self) -> None:
        """Measures event-loop lag: how late a 5 ms sleep wakes up."""
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(HEARTBEAT_S)
            self._lags.append(loop.time() - t0 - HEARTBEAT_S)

    # --- generation -----------------------------------------------------------------------
    async def generate(
        self,
        prompt: str | list[int],
        *,
        max_tokens: int = 128,
        sampling: SamplingSettings | None = None,
        chat: bool = True,
    ) -> AsyncIterator[str | RunStats]:
        """Stream text pieces of the continuation of `prompt`, then one RunStats.

        Args:
            prompt: text (encoded with the model's tokenizer, chat template when
                `chat`) or token ids.
            max_tokens: most tokens to generate.
            sampling: temperature / top-p / sample top-k; greedy by default.
        """
        if isinstance(prompt, list):
            ids = prompt
        else:  # chat templates compile on first use (~100 ms): keep that off the event loop
            ids = await asyncio.to_thread(encode_prompt, self.tokenizer, prompt, chat)
        detok = self.tokenizer.detokenizer
        detok.reset()
        async for tok in self.tokens(ids, max_tokens=max_tokens, sampling=sampling):
            detok.add_token(tok)
            segment = detok.last_segment  # reading it consumes it
            if segment:
                yield segment
        detok.finalize()
        segment = detok.last_segment
        if segment:
            yield segment
        assert self.last_stats is not None
        yield self.last_stats

    async def tokens(
        self, ids: list[int], *, max_tokens: int = 128, sampling: SamplingSettings | None = None,
        stop: bool = True,
    ) -> AsyncIterator[int]:  # fmt: skip
        """Stream generated token ids (the engine's core loop); stats land in `last_stats`."""
        config = self.setup.manifest.config
        text_config = config.get("text_config") or config
        context = int(text_config.get("max_position_embeddings") or 1 << 30)
        if not ids:
            raise PromptError("the prompt is empty; pass some text")
        if len(ids) >= context:
            raise PromptError(
                f"the prompt is {len(ids)} tokens but {self.setup.path / 'config.json'} allows "
                f"{context} (max_position_embeddings); shorten the prompt"
            )
        max_tokens = min(max_tokens, context - len(ids))
        sampler = (sampling or SamplingSettings()).sampler()
        eos = set(getattr(self.tokenizer, "eos_token_ids", None) or []) if stop else set()
        async with self._fifo:
            request = next(self._ids)
            ctx, sched = self.setup.ctx, self.setup.scheduler
            model = self.setup.model
            runner = await self._compute.run(lambda: Runner(model, ctx, request, sampler))
            first_record = len(ctx.records)
            reads0 = attrs.evolve(sched.stats, by_tier=dict(sched.stats.by_tier)) if sched else None
            await self._compute.run(mx.reset_peak_memory)
            self._lags = []
            stats = RunStats(mode=ctx.mode, top_k=ctx.top_k, prompt_tokens=len(ids),
                             predictor=getattr(ctx.predictor, "name", ""),
                             prefill_chunk=ctx.prefill_chunk)  # fmt: skip
            stats.finish_reason = "cancelled"
            t0 = time.perf_counter()
            io_at_decode: float | None = None
            bytes_at_decode: int | None = None
            try:
                tok = await self._compute.run(lambda: runner.prefill(ids))
                t1 = time.perf_counter()
                stats.prefill_s = t1 - t0
                if sched is not None and reads0 is not None:
                    io_at_decode, bytes_at_decode = t1, sched.stats.bytes
                    stats.prefill_bytes_per_token = (bytes_at_decode - reads0.bytes) / len(ids)
                n = 0
                while True:
                    if tok in eos:
                        stats.finish_reason = "stop"
                        break
                    n += 1
                    stats.generated_tokens = n
                    stats.decode_s = time.perf_counter() - t1
                    yield tok
                    if n >= max_tokens:
                        stats.finish_reason = "length"
                        break
                    tok = await self._compute.run(functools.partial(runner.feed, tok, False))
                    stats.decode_steps += 1
                stats.decode_s = time.perf_counter() - t1
            except Exception:
                stats.finish_reason = "error"
                raise
            finally:
                self._finish(stats, first_record, reads0, io_at_decode, bytes_at_decode)

    def _finish(
        self, stats: RunStats, first_record: int, reads0: ReadStats | None,
        io_at_decode: float | None, bytes_at_decode: int | None,
    ) -> None:  # fmt: skip
        ctx, sched = self.setup.ctx, self.setup.scheduler
        reads = diff_reads(sched.stats, reads0) if sched and reads0 else ReadStats()
        decode_io, decode_bytes = 0.0, 0
        if sched is not None and io_at_decode is not None and bytes_at_decode is not None:
            decode_io = sched.io_time(io_at_decode, time.perf_counter())
            decode_bytes = sched.stats.bytes - bytes_at_decode
        fill(stats, ctx.records[first_record:], reads, decode_io, decode_bytes)
        stats.peak_mlx_bytes = peak_mlx_bytes()
        stats.peak_rss_bytes = peak_rss_bytes()
        lags = sorted(self._lags) or [0.0]
        stats.loop_max_lag_ms = lags[-1] * 1e3
        stats.loop_p99_lag_ms = lags[int(0.99 * (len(lags) - 1))] * 1e3
        self.last_stats = stats
        log.info("request_done", **{k: v for k, v in stats.to_dict().items() if k != "tier_reads"})


class SyncEngine:
    """Blocking wrapper: `with SyncEngine(path, mode="route") as eng: for p in eng.generate(...)`.

    Runs a private event loop (uvloop when installed) only while a call is active.
    """

    def __init__(self, path: str | Path, **options: Any) -> None:
        self._runner = asyncio.Runner(loop_factory=_loop_factory())
        self._cm = Engine.open(path, **options)
        try:
            self.engine: Engine = self._runner.run(self._cm.__aenter__())
        except BaseException:
            self._runner.close()
            raise

    def generate(self, prompt: str | list[int], **kw: Any) -> Iterator[str | RunStats]:
        agen: Any = self.engine.generate(prompt, **kw)
        try:
            while True:
                try:
                    yield self._runner.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._runner.run(agen.aclose())

    def close(self) -> None:
        self._runner.run(self._cm.__aexit__(None, None, None))
        self._runner.close()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return None
    return uvloop.new_event_loop


def run(main: Any) -> Any:
    """asyncio.run with uvloop when installed."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main)
