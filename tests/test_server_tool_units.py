"""Tool-call text split out of an answer whatever its pieces, and the refusals around tools:
a model whose template has no tool calling, a forced call in a format the grammar cannot
write, a schema the grammar library cannot enforce."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.tool_parsers import json_tools, qwen3_coder

from edge0.errors import RequestError
from edge0.server import schemas
from edge0.server.backend import Backend
from edge0.server.decoding import Grammars
from edge0.server.tool_calls import ToolCallStream
from edge0.server.tool_fields import Tool

CALL = '<tool_call>\n{"name": "get", "arguments": {"k": 1}}\n</tool_call>'


class ToolTokenizer:
    """What ToolCallStream reads from mlx-lm's wrapper."""

    def __init__(self, module: Any = json_tools, has: bool = True) -> None:
        self.tool_call_start = module.tool_call_start
        self.tool_call_end = module.tool_call_end
        self.tool_parser = module.parse_tool_call
        self.has_tool_calling = has


def _split(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _run(pieces: list[str], single: bool = False) -> tuple[str, list[tuple[str, Any]]]:
    stream = ToolCallStream(ToolTokenizer(), (Tool("get"),), single=single)
    events = [e for p in pieces for e in stream.feed(p)] + stream.close()
    text = "".join(v for k, v in events if k == "text")
    return text, [(c.name, c.arguments) for k, c in events if k == "call"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=8))
def test_calls_and_text_come_out_whatever_the_pieces(cuts: list[int]) -> None:
    answer = "Let me look. <tool_" + CALL + " and " + CALL + " <tool_call>{broken"
    text, calls = _run(_split(answer, cuts))
    assert calls == [("get", {"k": 1}), ("get", {"k": 1})]
    assert text == "Let me look. <tool_ and  <tool_call>{broken"


def test_a_call_that_does_not_parse_stays_text_and_single_keeps_the_first() -> None:
    bad = "<tool_call>\nnot json\n</tool_call>"
    assert _run([bad]) == (bad, [])
    assert _run([CALL + " tail " + CALL], single=True) == ("", [("get", {"k": 1})])


class FakeEngine:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.options = type("Options", (), {"max_batch": 1})()


def _backend(tokenizer: Any) -> Backend:
    b = Backend.__new__(Backend)
    b.engine = FakeEngine(tokenizer)  # type: ignore[assignment]
    return b


def _chat(**body: Any) -> Any:
    return schemas.chat_request({"messages": [{"role": "user", "content": "x"}], **body})


TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]


def test_tools_on_a_model_without_tool_calling_are_refused() -> None:
    b = _backend(ToolTokenizer(has=False))
    with pytest.raises(RequestError, match="no tool calling") as err:
        b.grammar(_chat(tools=TOOLS))
    assert err.value.param == "tools"
    assert b.grammar(_chat(tools=TOOLS, tool_choice="none")) is None  # tools unused: fine


def test_forcing_a_call_needs_the_json_tool_format() -> None:
    b = _backend(ToolTokenizer(qwen3_coder))
    assert b.grammar(_chat(tools=TOOLS)) is None  # auto: parsed, not forced
    with pytest.raises(RequestError, match="json_tools") as err:
        b.grammar(_chat(tools=TOOLS, tool_choice="required"))
    assert err.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"tool_choice": "required"}, "needs `tools`"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not in `tools`",
        ),
        ({"tools": TOOLS * 2}, "twice"),
        ({"tools": [{"type": "custom", "custom": {}}]}, '"type": "function"'),
        ({"response_format": {"type": "yaml"}}, "json_schema"),
        ({"top_logprobs": 2}, "needs `logprobs: true`"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "send one",
        ),
    ],
)
def test_bad_agent_fields_are_refused(body: dict[str, Any], words: str) -> None:
    with pytest.raises(RequestError, match=words):
        _chat(**body)


def test_a_schema_the_grammar_cannot_enforce_is_a_400() -> None:
    from transformers import AutoTokenizer

    from edge0.model.demo import teacher_path

    hf = AutoTokenizer.from_pretrained(str(teacher_path()))
    grammars = Grammars(hf, 8192, [0])
    with pytest.raises(RequestError, match="cannot be enforced") as err:
        grammars.check(Grammars.json_grammar({"type": "frob"}), "response_format")
    assert err.value.param == "response_format"
    ok = Grammars.tool_grammar([("get", {"type": "object"})], "<tool_call>", "</tool_call>")
    assert grammars.check(ok, "tool_choice") == ok
    assert json.loads(Grammars.json_grammar({"type": "object"}))  # llguidance's JSON form
