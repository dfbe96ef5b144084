"""The async API: `async with Engine.open(path) as eng:`, then `async for p in eng.generate(...)`
(docs/runtime.md, "The Engine API").
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import structlog

from edge0 import log as edge0_log
from edge0.errors import PromptError
from edge0.log import get_logger
from edge0.model.generate import SamplingSettings, TextStream, encode_prompt
from edge0.options.declare import signature_doc
from edge0.options.engine import EngineOptions
from edge0.routing.validation import exactness, warn_unvalidated, with_mode
from edge0.runtime.compute.thread import ComputeThread
from edge0.runtime.engine.batcher import Batcher
from edge0.runtime.engine.requests import EngineClosedError, Request
from edge0.runtime.engine.solo import run_request
from edge0.runtime.engine.summary import RunStats
from edge0.runtime.setup.build import Setup, build

__all__ = ["Engine"]
T = TypeVar("T")

log = get_logger("edge0.runtime.engine.api")
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
        self.batcher = Batcher(self) if self.options.max_batch > 1 else None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, path: str | Path, **options: Any) -> AsyncIterator[Engine]:
        """Load `path` (an edge0-layout directory) and start the runtime.

        The keyword options are EngineOptions' fields (edge0/options/engine.py):
        """
        if not structlog.is_configured():  # a library stays quiet unless the app configures logs
            edge0_log.configure("warning")
        asked = EngineOptions(**options)
        opts = with_mode(asked, path)  # no mode given: route on validated heads, else hint
        compute = ComputeThread()
        try:
            if opts.hosts is not None:  # a pipeline over several ranks: this is rank 0
                from edge0.ranks.launch import build_pipeline

                opts.check()
                setup = await build_pipeline(Path(path), opts, compute)
            else:
                setup = await build(Path(path), opts, compute)
        except BaseException:
            compute.close()
            raise
        predictor = getattr(setup.ctx.predictor, "name", "")
        setup.exactness = exactness(opts, path, predictor)
        validated = setup.exactness.startswith("approximate (route, agreement")
        if asked.mode == "route" and setup.exactness != "exact" and not validated:
            warn_unvalidated(setup.exactness)  # once, as the engine opens
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
        self,
        ids: list[int],
        *,
        max_tokens: int = 128,
        sampling: SamplingSettings | None = None,
        stop: bool = True,
        stats_to: list[RunStats] | None = None,
    ) -> AsyncIterator[int]:
        """Stream generated token ids; the request's stats land in `last_stats` (and, when
        the stream runs to its end, in `stats_to`: with batching, `last_stats` may be
        another request's)."""
        req = self._submit(ids, max_tokens, sampling, stop)
        try:
            async with contextlib.aclosing(req.stream()) as stream:
                async for tok in stream:
                    yield tok
        finally:  # ended (or failed) by the engine: its stats are final
            if stats_to is not None and req.state == "done" and req.stats is not None:
                stats_to.append(req.stats)

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
        req = Request(
            next(self._ids),
            list(ids),
            min(max_tokens, context - len(ids)),
            sampling or SamplingSettings(),
            frozenset(eos),
        )
        self._pending.put_nowait(req)
        self._idle.clear()
        if self.batcher is not None:
            self.batcher.notify()
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
        if self.batcher is not None:
            await self.batcher.serve()
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
                await run_request(self, req)
            except asyncio.CancelledError:
                req.finish(EngineClosedError("the engine closed during this request"))
                raise
            except Exception as exc:  # noqa: BLE001 - the request's error, not the engine's
                req.finish(exc)
            else:
                req.finish()


def _open_signature() -> None:
    """Engine.open's signature and the list of its options, from EngineOptions' fields."""
    fn = Engine.open.__func__  # type: ignore[attr-defined]
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("cls", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str | Path"),
        *(inspect.Parameter(a.name, kw, default=a.default) for a in attrs.fields(EngineOptions)),
    ]
    fn.__signature__ = inspect.Signature(params)
    if fn.__doc__:
        fn.__doc__ = fn.__doc__.rstrip() + "\n" + signature_doc(EngineOptions) + "\n"


_open_signature()
