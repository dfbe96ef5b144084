"""Chat histories of both APIs read into `Message`s: text, tool calls and tool results.

OpenAI: roles system, developer (read as system), user, assistant (content and/or
`tool_calls`), tool (`tool_call_id`, content). Anthropic: roles user and assistant
with a string or content blocks: text, `tool_use` (assistant) and `tool_result`
(user; each becomes a tool message). Other parts (images, documents, thinking)
are refused with a RequestError naming the part.
"""

from __future__ import annotations

from typing import Any

import attrs

from edge0.errors import RequestError
from edge0.server.field_errors import bad as _bad
from edge0.server.field_errors import json_kind, missing, shown
from edge0.server.tool_fields import ToolCall, openai_tool_calls


@attrs.frozen
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def template(self) -> dict[str, Any]:
        """The message as chat templates take it (tool calls in the OpenAI form)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.template() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def text_of(value: Any, name: str) -> str:
    """Content that may only be text: a string or a list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = shown(part.get("type")) if isinstance(part, dict) else json_kind(part)
                raise RequestError(
                    f"`{name}[{i}]` is a {kind} part; this server reads text only",
                    param=f"{name}[{i}]",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{name}[{i}].text", "a string", text)
            parts.append(text)
        return "".join(parts)
    raise _bad(name, "a string or a list of text parts", value)


def _raw_list(body: dict[str, Any]) -> list[Any]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise (
            missing("messages")
            if raw is None
            else _bad("messages", "a non-empty list of messages", raw)
        )
    return raw


def _role(m: Any, where: str, roles: tuple[str, ...]) -> str:
    if not isinstance(m, dict):
        raise _bad(where, "an object with `role` and `content`", m)
    role = m.get("role")
    if role not in roles:
        raise RequestError(
            f"`{where}.role` must be one of {', '.join(roles)}, not {shown(role)}",
            param=f"{where}.role",
        )
    return str(role)


def openai_messages(body: dict[str, Any]) -> list[Message]:
    """`messages` of a chat completion request."""
    out = []
    for i, m in enumerate(_raw_list(body)):
        where = f"messages[{i}]"
        role = _role(m, where, ("system", "developer", "user", "assistant", "tool"))
        content = m.get("content")
        if content is None and role != "assistant":  # an assistant may send tool_calls only
            raise _bad(f"{where}.content", "a string or a list of text parts", content)
        text = "" if content is None else text_of(content, f"{where}.content")
        if role == "assistant":
            calls = openai_tool_calls(m.get("tool_calls"), f"{where}.tool_calls")
            out.append(Message(role, text, tool_calls=calls))
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise _bad(f"{where}.tool_call_id", "a string", call_id)
            out.append(Message(role, text, tool_call_id=call_id))
        else:
            out.append(Message("system" if role == "developer" else role, text))
    return out


def _result_text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, list | str):
        return text_of(value, where)
    raise _bad(where, "a string or text blocks", value)


def _tool_use(b: dict[str, Any], at: str) -> ToolCall:
    """An assistant's `tool_use` block: id, name and an object `input`, all required."""
    call_id, name, given = b.get("id"), b.get("name"), b.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{at}.id", "a non-empty string", call_id)
    if not isinstance(name, str) or not name:
        raise _bad(f"{at}.name", "a tool name", name)
    if not isinstance(given, dict):
        raise _bad(f"{at}.input", "an object", given)
    return ToolCall(call_id, name, given)


def _tool_result(b: dict[str, Any], at: str) -> Message:
    """A user's `tool_result` block as a tool message (`is_error` prefixes `Error:`)."""
    call_id = b.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{at}.tool_use_id", "the id of the tool_use it answers", call_id)
    content = _result_text(b.get("content"), f"{at}.content")
    if b.get("is_error") is True:
        content = f"Error: {content}"
    return Message("tool", content, tool_call_id=call_id)


def _anthropic_blocks(role: str, blocks: list[Any], where: str) -> list[Message]:
    """One Anthropic turn: text and tool_use blocks make one message; each tool_result one."""
    text: list[str] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    for j, b in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(text_of([b], at))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(b, at))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(b, at))
        else:
            what = shown(kind) if kind is not None else json_kind(b)
            raise RequestError(
                f"`{at}` is a {what} block; this server reads text, "
                "tool_use (assistant) and tool_result (user) blocks",
                param=at,
            )
    own = [Message(role, "".join(text), tool_calls=tuple(calls))] if text or calls else []
    return results + own


def anthropic_messages(body: dict[str, Any]) -> list[Message]:
    """`messages` (and `system`) of a Messages request, system first."""
    out: list[Message] = []
    system = body.get("system")
    if system is not None:
        text = text_of(system, "system")
        if text:
            out.append(Message("system", text))
    for i, m in enumerate(_raw_list(body)):
        where = f"messages[{i}]"
        role = _role(m, where, ("user", "assistant"))
        if i == 0 and role != "user":
            raise RequestError(
                "`messages[0].role` must be user: a conversation starts with the user's turn "
                "(put instructions in `system`)",
                param="messages[0].role",
            )
        content = m.get("content")
        if isinstance(content, list):
            out.extend(_anthropic_blocks(role, content, where))
        elif isinstance(content, str):
            out.append(Message(role, content))
        else:
            raise _bad(f"{where}.content", "a string or a list of content blocks", content)
    return out
