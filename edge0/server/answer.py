"""The answer to one request: its `n` choices as one stream of events, tool calls parsed out.

Each choice is a Generation (edge0.server.backend); `Answer.events()` runs them
side by side (they decode as requests of one batch) and yields `Event`s in the
order they happen: text pieces with the log-probabilities of their tokens, parsed
tool calls (edge0.server.tool_calls), and one `end` per choice. `Answer.whole()`
collects the same into one `Choice` per index. Closing the stream closes every
choice's engine stream, which cancels its request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any, cast

import attrs

from edge0.server.decoding import TokenLogprob
from edge0.server.generation import Generation
from edge0.server.tool_calls import ToolCallStream
from edge0.server.tool_fields import ToolCall, ToolUse

_END = object()


@attrs.frozen
class Event:
    index: int
    kind: str  # text | call | end
    text: str = ""
    call: ToolCall | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


@attrs.define
class Choice:
    index: int
    text: str = ""
    calls: list[ToolCall] = attrs.field(factory=list)
    logprobs: list[TokenLogprob] = attrs.field(factory=list)


class Answer:
    """The choices of one request; read `events()` once (or `whole()`), then the usage."""

    def __init__(
        self, gens: list[Generation], tools: ToolUse, tokenizer: Any, id_prefix: str
    ) -> None:
        self.gens = gens
        self._streams = [
            ToolCallStream(tokenizer, tools.tools, id_prefix, single=not tools.parallel)
            if tools.active
            else None
            for _ in gens
        ]

    @property
    def prompt_tokens(self) -> int:
        return self.gens[0].prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(g.completion_tokens for g in self.gens)

    def finish(self, index: int) -> str:
        """The choice's finish: stop | length | stop_sequence | tool_calls | error | ..."""
        stream = self._streams[index]
        if stream is not None and stream.calls:
            return "tool_calls"
        return self.gens[index].finish_reason

    async def _choice(self, index: int) -> AsyncGenerator[Event, None]:
        gen = self.gens[index]
        stream = self._streams[index]
        pending: list[TokenLogprob] = []
        async with contextlib.aclosing(cast(AsyncGenerator[str, None], gen.deltas())) as pieces:
            async for piece in pieces:
                pending += gen.take_logprobs()
                out = stream.feed(piece) if stream else [("text", piece)]
                for kind, value in out:
                    if kind == "text":
                        yield Event(index, "text", value, logprobs=tuple(pending))
                        pending = []
                    else:
                        yield Event(index, "call", call=cast(ToolCall, value))
        for _, value in stream.close() if stream else []:
            yield Event(index, "text", value, logprobs=tuple(pending))
            pending = []
        pending += gen.take_logprobs()
        yield Event(index, "end", logprobs=tuple(pending))

    async def events(self) -> AsyncGenerator[Event, None]:
        """Every choice's events as they come (a failing choice raises its error here), once
        the request has its places (edge0.server.admission: it may wait, or be refused)."""
        async with self.gens[0].backend.admission.place(len(self.gens)):
            async with contextlib.aclosing(self._events()) as events:
                async for event in events:
                    yield event

    async def _events(self) -> AsyncGenerator[Event, None]:
        if len(self.gens) == 1:
            async with contextlib.aclosing(self._choice(0)) as only:
                async for event in only:
                    yield event
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(index: int) -> None:
            try:
                async with contextlib.aclosing(self._choice(index)) as events:
                    async for event in events:
                        await queue.put(event)
            except Exception as exc:  # noqa: BLE001 - handed to the reader
                await queue.put(exc)
            finally:
                await queue.put(_END)

        tasks = [asyncio.create_task(pump(i)) for i in range(len(self.gens))]
        try:
            running = len(tasks)
            while running:
                item = await queue.get()
                if item is _END:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def deltas(self) -> AsyncGenerator[Event, None]:
        """`events()` under the name edge0.server.http.open_stream reads."""
        return self.events()

    async def whole(self) -> list[Choice]:
        choices = [Choice(i) for i in range(len(self.gens))]
        async with contextlib.aclosing(self.events()) as events:
            async for e in events:
                c = choices[e.index]
                c.text += e.text
                c.logprobs += e.logprobs
                if e.call is not None:
                    c.calls.append(e.call)
        return choices
