"""One request's text from the engine: detokenized, cut at stop strings, counted.

A Generation streams the text of one request from `Engine.tokens`, detokenized
the way `Engine.generate` does it (a TextStream per request), holds back text that
may begin a stop string, counts usage and reports the request to the metrics when
it ends. Its engine stream is always closed (stop string, error, client gone),
which cancels the request in the engine after the step in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol, cast

from edge0.errors import TierReadError
from edge0.model.generate import SamplingSettings, TextStream
from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.summary import RunStats
from edge0.server.admission import Admission
from edge0.server.decoding import Decoding, TokenLogprob
from edge0.server.metrics import ServerMetrics
from edge0.server.schemas import Sampling


class Serving(Protocol):
    """What a generation uses of the server's backend (edge0.server.backend.Backend)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def metrics(self) -> ServerMetrics: ...

    @property
    def admission(self) -> Admission: ...


def sampling_settings(s: Sampling, hooks: Decoding | None = None) -> SamplingSettings:
    """The engine's sampling settings for a request's."""
    seed = None if s.seed is None else s.seed % (1 << 64)  # the APIs allow negative seeds
    return SamplingSettings(
        max_tokens=s.max_tokens or 1 << 30,
        temp=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        seed=seed,
        hooks=hooks,
    )


def _stop_cut(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """(index, stop string) of the earliest stop string in `text`."""
    found = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    return min(found) if found else None


def _held(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of `text` could be the start of a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best


class Generation:
    """One request's text stream; read `deltas()` once, then the usage fields."""

    def __init__(
        self,
        backend: Serving,
        api: str,
        ids: list[int],
        sampling: Sampling,
        hooks: Decoding | None = None,
    ) -> None:
        self.backend = backend
        self.hooks = hooks
        self._logprobs_taken = 0
        self.api = api
        self.ids = ids
        self.sampling = sampling
        self.prompt_tokens = len(ids)
        self.completion_tokens = 0
        self.finish_reason = ""  # stop (EOS) | length | stop_sequence | cancelled | error
        self.stop_sequence: str | None = None
        self.stats: RunStats | None = None
        self.started = time.perf_counter()
        self.first_token_s: float | None = None
        self._stop_at = 0

    async def deltas(self) -> AsyncIterator[str]:
        """The new text, piece by piece (never an empty piece)."""
        engine, stops = self.backend.engine, self.sampling.stop
        detok = TextStream(engine.tokenizer)
        ours: list[RunStats] = []  # this request's stats, when its stream ends by itself
        pending = ""
        self.backend.metrics.started()
        try:
            tokens = engine.tokens(
                self.ids,
                max_tokens=self.sampling.max_tokens or 1 << 30,
                sampling=sampling_settings(self.sampling, self.hooks),
                stats_to=ours,
            )
            async with contextlib.aclosing(cast(AsyncGenerator[int, None], tokens)) as toks:
                async for tok in toks:
                    if self.first_token_s is None:
                        self.first_token_s = time.perf_counter() - self.started
                    self.completion_tokens += 1
                    pending += detok.add(tok)
                    if self._cut_at_stop(pending):
                        break
                    keep = _held(pending, stops) if stops else 0
                    if len(pending) > keep:
                        cut = len(pending) - keep
                        out, pending = pending[:cut], pending[cut:]
                        yield out
            if self.finish_reason == "stop_sequence":
                pending = pending[: self._stop_at]
            else:
                pending += detok.flush()
                if self._cut_at_stop(pending):
                    pending = pending[: self._stop_at]
            if pending:
                yield pending
        except (asyncio.CancelledError, GeneratorExit):
            self.finish_reason = "cancelled"
            raise
        except BaseException as exc:
            self.finish_reason = "error"
            if isinstance(exc, TierReadError):
                self.backend.metrics.tier_error()
            raise
        finally:
            # a stream we closed (stop string, client gone) gets its stats later: none here
            natural = self.finish_reason in ("", "error")
            self.stats = ours[0] if natural and ours else None
            if not self.finish_reason:  # the engine's: stop (end of sequence) or length
                self.finish_reason = self.stats.finish_reason if self.stats else "length"
            self.backend.metrics.finished(self)

    def _cut_at_stop(self, text: str) -> bool:
        cut = _stop_cut(text, self.sampling.stop) if self.sampling.stop else None
        if cut is None:
            return False
        self._stop_at, self.stop_sequence = cut
        self.finish_reason = "stop_sequence"
        return True

    async def text(self) -> str:
        return "".join([piece async for piece in self.deltas()])

    def take_logprobs(self) -> list[TokenLogprob]:
        """The log-probabilities of the tokens generated since the last call."""
        if self.hooks is None or self.hooks.top_logprobs is None:
            return []
        got = self.hooks.records[self._logprobs_taken : self.completion_tokens]
        self._logprobs_taken += len(got)
        return got
