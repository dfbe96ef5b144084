"""The async API: `async with Engine.open(path) as eng:`, then `async for p in eng.generate(...)`.

One engine owns one model, one compute thread, one tier stack and one scheduler.
One worker task serves requests FIFO; each request's tokens go into its own queue
(edge0.runtime.requests), so no consumer, however slow or stuck, holds the engine.
A caller that closes its stream or is cancelled ends its request after the step
already running on the compute thread. A tier error ends that request with the
error; the next request runs normally. `SyncEngine` wraps it for plain code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import mlx.core as mx
import structlog

from edge0 import log as edge0_log
from edge0.errors import PromptError
from edge0.log import get_logger
from edge0.model.generate import SamplingSettings, TextStream, encode_prompt
from edge0.runtime.requests import EngineClosedError, Request
from edge0.runtime.runner import Runner, greedy
from edge0.runtime.scheduler import ComputeThread, ReadStats
from edge0.runtime.setup import EngineOptions, Setup, build
from edge0.runtime.stats import peak_mlx_bytes, peak_rss_bytes
from edge0.runtime.summary import RunStats, diff_reads, fill

T = TypeVar("T")

log = get_logger("edge0.runtime.engine")
HEARTBEAT_S = 0.005


class Engine:
    """A loaded model ready to stream; create it with `Engine.open`."""

    def __init__(self, setup: Setup, compute: ComputeThread) -> None:
        self.setup = setup
        self.options = setup.options
        self.tokenizer = setup.tokenizer
        self._compute = compute
        self._pending: asyncio.Queue[Request] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._arrivals = asyncio.Lock()  # held only while a prompt is encoded, never across yield
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
        first_layer="resident" (or "wrap", "reactive"), io_workers=2,
        sync_every=None (route: layers per host sync).
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
        self._worker = asyncio.create_task(self._serve(), name="edge0-worker")

    async def _close(self) -> None:
        for task in (self._worker, self._heartbeat):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        while not self._pending.empty():
            self._pending.get_nowait().finish(EngineClosedError("the engine closed first"))
        if self.setup.scheduler is not None:
            await self.setup.scheduler.aclose()
        if self.setup.tier is not None:
            await self.setup.tier.aclose()
        for close in self.setup.on_close:  # e.g. stopping the other ranks of a pipeline
            await close()
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
        async with self._arrivals:  # requests queue in call order, whatever encoding takes
            if isinstance(prompt, list):
                ids = prompt
            else:  # chat templates compile on first use (~100 ms): keep that off the event loop
                ids = await asyncio.to_thread(encode_prompt, self.tokenizer, prompt, chat)
            req = self._submit(ids, max_tokens, sampling, True)
        detok = TextStream(self.tokenizer)  # one per request: requests may overlap
        async with contextlib.aclosing(req.stream()) as stream:
            async for tok in stream:
                segment = detok.add(tok)
                if segment:
                    yield segment
        segment = detok.flush()
        if segment:
            yield segment
        assert req.stats is not None
        yield req.stats

    async def tokens(
        self, ids: list[int], *, max_tokens: int = 128, sampling: SamplingSettings | None = None,
        stop: bool = True,
    ) -> AsyncIterator[int]:  # fmt: skip
        """Stream generated token ids; the request's stats land in `last_stats`."""
        req = self._submit(ids, max_tokens, sampling, stop)
        async with contextlib.aclosing(req.stream()) as stream:
            async for tok in stream:
                yield tok

    def _submit(
        self, ids: list[int], max_tokens: int, sampling: SamplingSettings | None, stop: bool
    ) -> Request:
        """Check the prompt and queue a request for the worker."""
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
        if self.setup.memory_plan is not None:  # the KV cache was planned for this many tokens
            context = min(context, self.options.context)
            if len(ids) >= context:
                raise PromptError(
                    f"the prompt is {len(ids)} tokens but the memory budget was planned for a "
                    f"context of {context}; shorten the prompt or open the engine with a larger "
                    "context= (--context)"
                )
        if self._worker is None or self._worker.done():
            raise EngineClosedError("the engine is closed; open a new one with Engine.open")
        eos = (getattr(self.tokenizer, "eos_token_ids", None) or []) if stop else []
        req = Request(next(self._ids), list(ids), min(max_tokens, context - len(ids)),
                      sampling or SamplingSettings(), frozenset(eos))  # fmt: skip
        self._pending.put_nowait(req)
        self._idle.clear()
        return req

    async def run_on_compute(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the compute thread once queued requests are done: for tools that drive
        `setup.model` with their own Runner (edge0.eval.policy's teacher-forced decode)."""
        await self.wait_idle()
        return await self._compute.run(fn)

    async def wait_idle(self) -> None:
        """Until every submitted request has finished (a closed stream's ends one step later)."""
        await self._idle.wait()

    async def _serve(self) -> None:
        """The engine's one worker: runs queued requests in order; no consumer can stall it."""
        while True:
            if self._pending.empty():
                self._idle.set()
            req = await self._pending.get()
            self._idle.clear()
            if req.cancelled:
                req.finish()
                continue
            req.state = "running"
            try:
                await self._run(req)
            except asyncio.CancelledError:
                req.finish(EngineClosedError("the engine closed during this request"))
                raise
            except Exception as exc:  # noqa: BLE001 - the request's error, not the engine's
                req.finish(exc)
            else:
                req.finish()

    async def _run(self, req: Request) -> None:
        """One request's steps on the compute thread; tokens go to its queue as they come."""
        ctx, sched = self.setup.ctx, self.setup.scheduler
        settings = req.settings
        runner = await self._compute.run(  # the sampler is seeded on this thread
            lambda: self.setup.make_runner(req.id, settings.sampler(), settings)
        )
        first_record = len(ctx.records)
        reads0 = attrs.evolve(sched.stats, by_tier=dict(sched.stats.by_tier)) if sched else None
        await self._compute.run(mx.reset_peak_memory)
        self._lags = []
        stats = RunStats(mode=ctx.mode, top_k=ctx.top_k, prompt_tokens=len(req.ids),
                         predictor=getattr(ctx.predictor, "name", ""),
                         prefill_chunk=_chunk(runner),
                         route_policy=_policy(ctx.mode, self.options))  # fmt: skip
        stats.finish_reason = "cancelled"
        t0 = time.perf_counter()
        io_at_decode: float | None = None
        bytes_at_decode: int | None = None
        try:
            tok = await self._compute.run(lambda: _prefill(runner, req.ids, req.max_tokens > 1))
            t1 = time.perf_counter()
            stats.prefill_s = t1 - t0
            if sched is not None and reads0 is not None:
                io_at_decode, bytes_at_decode = t1, sched.stats.bytes
                stats.prefill_bytes_per_token = (bytes_at_decode - reads0.bytes) / len(req.ids)
            n = 0
            while True:
                if tok in req.eos:
                    stats.finish_reason = "stop"
                    break
                n += 1
                stats.generated_tokens = n
                stats.decode_s = time.perf_counter() - t1
                req.put(tok)
                if n >= req.max_tokens:
                    stats.finish_reason = "length"
                    break
                if req.cancelled:
                    break
                more = n + 1 < req.max_tokens  # else no prefetch: no step uses it
                tok = await self._compute.run(functools.partial(runner.feed, tok, False, more))
                stats.decode_steps += 1
            stats.decode_s = time.perf_counter() - t1
        except Exception:
            stats.finish_reason = "error"
            raise
        finally:
            self._compute.submit(runner.finish)  # after its last step: cancel queued prefetches
            req.stats = stats
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


def _policy(mode: str, opts: Any) -> str:
    return str(opts.route_policy) if mode == "route" else ""


def _chunk(runner: Any) -> int:
    """Prompt tokens per forward: a pipeline's rank 0 (edge0.dist) feeds one token per step."""
    return runner.steps.prefill_chunk if isinstance(runner, Runner) else 1


def _prefill(runner: Runner, ids: list[int], decode: bool) -> int:
    """Feed the prompt; only its last step draws (so a seed's first draw is the first token)
    and, when a decode step follows (`decode`), prefetches."""
    if _chunk(runner) > 1 and len(ids) > 1:  # chunked: only the last chunk draws
        return runner.prefill(ids, decode=decode)
    sampler, runner.sampler = runner.sampler, greedy
    try:
        runner.prefill(ids[:-1], decode=False)
    finally:
        runner.sampler = sampler
    return runner.feed(ids[-1], prefill=True, prefetch=decode)


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
