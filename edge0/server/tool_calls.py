"""The model's tool-call text found in its answer and parsed by the tokenizer's own parser.

mlx-lm's tokenizer wrapper knows the tool-call markers of the model's chat template
(`tool_call_start` / `tool_call_end`) and the parser for the text between them
(`tool_parser`, mlx_lm.tool_parsers). `ToolCallStream` splits an answer, piece by
piece, into text and complete tool calls: text that may begin a marker is held back,
a call is handed on once its end marker arrives. A call that does not parse stays
text; so does an unterminated one at the end.
"""

from __future__ import annotations

import uuid
from typing import Any

from edge0.server.tool_fields import Tool, ToolCall


def _held(text: str, marker: str) -> int:
    """How many trailing characters of `text` could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


class ToolCallStream:
    """Feed answer pieces; get back ("text", str) and ("call", ToolCall) events in order."""

    def __init__(
        self,
        tokenizer: Any,
        tools: tuple[Tool, ...],
        id_prefix: str = "call_",
        single: bool = False,
    ) -> None:
        self.start: str = tokenizer.tool_call_start
        self.end: str = tokenizer.tool_call_end
        self.parser = tokenizer.tool_parser
        self.tools = [t.template() for t in tools]
        self.prefix = id_prefix
        self.single = single  # one call at most (parallel calls off): the rest is dropped
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._inside = False

    def feed(self, piece: str) -> list[tuple[str, Any]]:
        self._buf += piece
        out: list[tuple[str, Any]] = []
        while True:
            if not self._inside:
                at = self._buf.find(self.start)
                if at < 0:
                    keep = _held(self._buf, self.start)
                    self._text(out, self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                self._text(out, self._buf[:at])
                self._buf, self._inside = self._buf[at:], True
            at = self._buf.find(self.end, len(self.start))
            if at < 0:
                return out
            raw = self._buf[: at + len(self.end)]
            self._buf, self._inside = self._buf[at + len(self.end) :], False
            calls = self._parse(raw[len(self.start) : at])
            if calls is None:
                self._text(out, raw)
            for call in calls or []:
                if not (self.single and self.calls):
                    self.calls.append(call)
                    out.append(("call", call))

    def close(self) -> list[tuple[str, Any]]:
        """The end of the answer: what is still held back is text."""
        out: list[tuple[str, Any]] = []
        self._text(out, self._buf)
        self._buf, self._inside = "", False
        return out

    def _text(self, out: list[tuple[str, Any]], text: str) -> None:
        if text and not (self.single and self.calls):
            out.append(("text", text))

    def _parse(self, body: str) -> list[ToolCall] | None:
        try:
            parsed = self.parser(body, self.tools)
        except Exception:  # noqa: BLE001 - the model wrote something else: keep it as text
            return None
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return None
            args = item.get("arguments", {})
            if not isinstance(args, dict | str):
                return None
            calls.append(ToolCall(new_id(self.prefix), item["name"], args))
        return calls
