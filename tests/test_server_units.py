"""Server units: stop strings across piece boundaries (the streamed text is the generated text
cut before the first stop string, whatever the pieces; the engine's generator is closed at the
cut), and chat messages to prompt ids (template, plain layout, a template that refuses)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge0.errors import RequestError
from edge0.server.chat import chat_ids, plain_prompt
from edge0.server.generation import Generation
from edge0.server.metrics import ServerMetrics
from edge0.server.schemas import Message, Sampling


class PieceTokenizer:
    """Token i decodes to PIECES[i] (what TextStream needs: `decode`)."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


class FakeEngine:
    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces
        self.tokenizer = PieceTokenizer(pieces)
        self.last_stats = None
        self.pulled = 0
        self.closed = False

    async def tokens(self, ids: list[int], **kw: Any) -> Any:
        try:
            for i in range(len(self.pieces)):
                self.pulled += 1
                yield i
        finally:
            self.closed = True


def run(pieces: list[str], stops: tuple[str, ...]) -> tuple[list[str], Generation, FakeEngine]:
    engine = FakeEngine(pieces)
    backend: Any = type("B", (), {"engine": engine, "metrics": METRICS})()
    gen = Generation(backend, "test", [1], Sampling(max_tokens=len(pieces), stop=stops))

    async def main() -> list[str]:
        return [p async for p in gen.deltas()]

    return asyncio.run(main()), gen, engine


METRICS = ServerMetrics()
text = st.text(alphabet="ab\n", max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(text, min_size=1, max_size=8), st.lists(text.filter(bool), max_size=3))
@example(["a\n\n", "a"], ["\n", "a\n\na"])  # "\n" completes first: "a\n\na" is never made
def test_stream_is_the_text_cut_before_the_first_stop(pieces: list[str], stops: list[str]) -> None:
    out, gen, engine = run(pieces, tuple(stops))
    full, cuts = "", []
    for piece in pieces:  # generation stops at the first piece that completes a stop string
        full += piece
        cuts = [(full.find(s), s) for s in stops if s in full]
        if cuts:
            break
    want = full[: min(cuts)[0]] if cuts else full
    assert "".join(out) == want and all(out)
    assert engine.closed
    if cuts:
        assert gen.finish_reason == "stop_sequence" and gen.stop_sequence in stops
        assert gen.stop_sequence is not None and full.find(gen.stop_sequence) == min(cuts)[0]
    else:
        assert gen.finish_reason == "length" and gen.completion_tokens == len(pieces)


def test_generation_stops_pulling_tokens_at_the_stop_string() -> None:
    out, gen, engine = run(["ab", "c", "EN", "D", "x", "y"], ("END",))
    assert "".join(out) == "abc" and engine.pulled == 4 and engine.closed
    assert gen.completion_tokens == 4


def test_plain_chat_layout() -> None:
    assert plain_prompt([Message("user", "def f():")]) == "def f():"
    two = plain_prompt([Message("system", "Be brief."), Message("user", "hi")])
    assert two == "system: Be brief.\n\nuser: hi\n\nassistant:"


class TemplateTokenizer:
    has_chat_template = True

    def apply_chat_template(self, messages: list[dict[str, str]], **kw: Any) -> list[int]:
        assert kw == {"add_generation_prompt": True}
        if messages[0]["role"] == "system":
            raise ValueError("System role not supported")
        return [len(m["content"]) for m in messages]


def test_chat_template_and_its_refusals() -> None:
    tok = TemplateTokenizer()
    assert chat_ids(tok, [Message("user", "abc"), Message("assistant", "de")]) == [3, 2]
    with pytest.raises(RequestError, match="chat template refused.*System role") as info:
        chat_ids(tok, [Message("system", "x"), Message("user", "y")])
    assert info.value.status == 400 and info.value.param == "messages"
