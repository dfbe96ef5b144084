"""The server's side of the engine: prompts to token ids (refused early when they cannot fit),
grammars, admission, one Generation (edge0.server.generation) per choice of a request."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import attrs

from edge0.errors import RequestError
from edge0.model.generate import encode_prompt
from edge0.runtime.engine.api import Engine
from edge0.server.admission import Admission
from edge0.server.chat import chat_ids
from edge0.server.decoding import ANY_OBJECT, Decoding, Grammars
from edge0.server.generation import Generation
from edge0.server.limits import Limits
from edge0.server.metrics import ServerMetrics
from edge0.server.prompt_bound import TokenBound
from edge0.server.schemas import TextRequest

JSON_TOOLS = "mlx_lm.tool_parsers.json_tools"


class Backend:
    """The engine and what every route needs from it."""

    def __init__(
        self,
        engine: Engine,
        model_id: str,
        metrics: ServerMetrics,
        limits: Limits | None = None,
        bound: TokenBound | None = None,
    ) -> None:
        self.engine = engine
        self.model_id = model_id
        self.metrics = metrics
        self.bound = bound  # a prompt's least token count from its bytes (None: tokenize)
        limits = limits or Limits()
        places = engine.options.max_batch
        self.admission = Admission(places, limits.max_queue, metrics)
        self.created = int(time.time())
        config = engine.setup.manifest.config
        text_config: dict[str, Any] = config.get("text_config") or config
        self.context = int(text_config.get("max_position_embeddings") or 1 << 30)
        self.vocab = int(text_config.get("vocab_size") or 1 << 62)
        eos = list(getattr(engine.tokenizer, "eos_token_ids", None) or [])
        self.grammars = Grammars(engine.tokenizer, self.vocab, eos)

    async def prompt_ids(self, request: TextRequest) -> list[int]:
        """Token ids of a request's prompt (chat template for messages), checked for length
        (`start` has refused a text that cannot fit from its size, before tokenizing)."""
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

    def _refuse_long_text(self, request: TextRequest) -> None:
        """A 400 when the prompt's text alone has more bytes than the context's tokens can
        cover (edge0.server.prompt_bound): a 1 MiB prompt is refused in microseconds. Chat
        counts user and tool messages only: a template may drop parts of the others."""
        if self.bound is None:
            return
        if request.messages:
            texts = [m.content for m in request.messages if m.role in ("user", "tool")]
        elif isinstance(request.prompt, str):
            texts = [request.prompt]
        else:
            return
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        least = self.bound.tokens_at_least(size)
        if least >= self.context:
            raise RequestError(
                f"the prompt is at least {least} tokens ({size} bytes of text; no token of this "
                f"tokenizer stands for more than {self.bound.bytes_per_token}) but this model's "
                f"context is {self.context} (max_position_embeddings); shorten the prompt",
                param="messages" if request.messages else "prompt",
                code="context_length_exceeded",
            )

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
        self._refuse_long_text(request)  # a prompt that can never fit: 400, not 429
        self.admission.check(request.n)  # a full queue refuses before any work
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
                field = wanted[1] if wanted else None
                hooks = await asyncio.to_thread(
                    Decoding, self.grammars, grammar, request.logprobs, field
                )
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
