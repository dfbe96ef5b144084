"""The server's side of the engine: prompts to token ids, one Generation per request.

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
from typing import Any, cast

import attrs

from edge0.errors import RequestError, TierReadError
from edge0.model.generate import SamplingSettings, TextStream, encode_prompt
from edge0.runtime.engine.api import Engine
from edge0.runtime.engine.summary import RunStats
from edge0.server.chat import chat_ids
from edge0.server.decoding import ANY_OBJECT, Decoding, Grammars, TokenLogprob
from edge0.server.metrics import ServerMetrics
from edge0.server.schemas import Sampling, TextRequest

JSON_TOOLS = "mlx_lm.tool_parsers.json_tools"


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
        backend: Backend,
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


class Backend:
    """The engine and what every route needs from it."""

    def __init__(self, engine: Engine, model_id: str, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.model_id = model_id
        self.metrics = metrics
        self.created = int(time.time())
        config = engine.setup.manifest.config
        text_config: dict[str, Any] = config.get("text_config") or config
        self.context = int(text_config.get("max_position_embeddings") or 1 << 30)
        self.vocab = int(text_config.get("vocab_size") or 1 << 62)
        eos = list(getattr(engine.tokenizer, "eos_token_ids", None) or [])
        self.grammars = Grammars(engine.tokenizer, self.vocab, eos)

    async def prompt_ids(self, request: TextRequest) -> list[int]:
        """Token ids of a request's prompt (chat template for messages), checked for length."""
        tok = self.engine.tokenizer
        if request.messages:  # templates compile on first use: off the event loop
            tools = [t.template() for t in request.tools.tools] if request.tools.active else None
            ids = await asyncio.to_thread(chat_ids, tok, list(request.messages), tools)
        elif isinstance(request.prompt, str):
            ids = await asyncio.to_thread(encode_prompt, tok, request.prompt, False)
        else:
            ids = list(request.prompt or [])
            if ids and max(ids) >= self.vocab:
                raise RequestError(
                    f"`prompt` has token id {max(ids)}; the vocabulary has {self.vocab} tokens",
                    param="prompt",
                )
        if not ids:
            raise RequestError("the prompt is empty; send some text", param="prompt")
        if len(ids) >= self.context:
            raise RequestError(
                f"the prompt is {len(ids)} tokens but this model's context is {self.context} "
                "(max_position_embeddings); shorten the prompt",
                param="messages" if request.messages else "prompt",
                code="context_length_exceeded",
            )
        return ids

    async def start(self, api: str, request: TextRequest) -> list[Generation]:
        """The request's `n` Generations (not started until their deltas are read): choice i
        samples with seed + i, so it equals a single request with that seed."""
        batch = self.engine.options.max_batch
        if request.n > batch:
            raise RequestError(
                f"`n` is {request.n} but this server decodes at most {batch} requests "
                "together (`edge0 serve --max-batch`)",
                param="n",
            )
        wanted = self.grammar(request)
        if (wanted or request.logprobs is not None) and self.engine.options.hosts is not None:
            raise RequestError(  # the last rank samples there, out of this process's reach
                "constrained output and logprobs are not served by a multi-rank engine "
                "(--hosts) yet",
                param=wanted[1] if wanted else "logprobs",
            )
        ids = await self.prompt_ids(request)
        grammar = None
        if wanted is not None:  # the grammar compiles in a worker thread (~ms to ~1 s)
            grammar = await asyncio.to_thread(self._checked, request, *wanted)
        gens = []
        for i in range(request.n):
            sampling = request.sampling
            if sampling.seed is not None and i:
                sampling = attrs.evolve(sampling, seed=sampling.seed + i)
            hooks = None
            if grammar is not None or request.logprobs is not None:
                hooks = await asyncio.to_thread(Decoding, self.grammars, grammar, request.logprobs)
            gens.append(Generation(self, api, ids, sampling, hooks))
        return gens

    def _checked(self, request: TextRequest, grammar: str, param: str) -> str:
        """`grammar` checked (a worker thread); a forced tool's own schema must admit a value
        too (one that only refers to itself would stop the call half written)."""
        if param == "tool_choice":
            for tool in request.tools.forced():
                schema = Grammars.json_grammar(tool.parameters or ANY_OBJECT)
                self.grammars.check(schema, "tools", f"tool {tool.name!r}'s schema")
        return self.grammars.check(grammar, param)

    def grammar(self, request: TextRequest) -> tuple[str, str] | None:
        """(grammar, the field it enforces) for a request's answer; None when it is free.
        Refuses tools on a model whose chat template has no tool calling."""
        tok, use = self.engine.tokenizer, request.tools
        if use.active and not getattr(tok, "has_tool_calling", False):
            raise RequestError(
                "this model's chat template has no tool calling (mlx-lm finds no "
                "tool-call format in it); send no `tools`, or tool_choice none",
                param="tools",
            )
        if request.json_schema is not None:
            return self.grammars.json_grammar(request.json_schema), "response_format"
        forced = use.forced()
        if not forced:
            return None
        if getattr(tok.tool_parser, "__module__", "") != JSON_TOOLS:
            raise RequestError(
                "`tool_choice` can force a call only on models whose tool calls "
                "are JSON objects (mlx-lm's json_tools format); use auto",
                param="tool_choice",
            )
        tools = [(t.name, t.parameters) for t in forced]
        grammar = self.grammars.tool_grammar(tools, tok.tool_call_start, tok.tool_call_end)
        return grammar, "tool_choice"
