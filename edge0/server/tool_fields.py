"""The agent fields of a request: tools, tool choice, tool calls in the history, response format.

Both APIs' forms are read into one shape: `Tool` (name, description, JSON-schema
parameters), `ToolCall` (id, name, arguments), `ToolUse` (the tools offered and
the choice: auto, none, required, or one tool by name). A field of the wrong
shape is a RequestError naming it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from edge0.errors import RequestError
from edge0.server.field_errors import bad as _bad
from edge0.server.field_errors import missing, shown

CHOICES = ("auto", "none", "required")
NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@attrs.frozen
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = attrs.field(factory=dict)

    def template(self) -> dict[str, Any]:
        """The OpenAI form chat templates expect."""
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


@attrs.frozen
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] | str  # a string when the client's text is not a JSON object

    def template(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@attrs.frozen
class ToolUse:
    """The tools of a request and what the model may do with them."""

    tools: tuple[Tool, ...] = ()
    choice: str = "auto"  # auto | none | required | named
    name: str | None = None  # the tool a `named` choice forces
    parallel: bool = True  # False: at most one call per answer

    @property
    def active(self) -> bool:
        """Tools go to the template and the answer is parsed for calls."""
        return bool(self.tools) and self.choice != "none"

    def forced(self) -> list[Tool]:
        """The tools one of which the answer must call (empty: the model chooses)."""
        if self.choice == "required":
            return list(self.tools)
        if self.choice == "named":
            return [t for t in self.tools if t.name == self.name]
        return []


def _schema(value: Any, name: str, required: bool = False) -> dict[str, Any]:
    if value is None and required:
        raise missing(name)
    if value is None:
        return {"type": "object"}
    if not isinstance(value, dict):
        raise _bad(name, "a JSON schema object", value)
    return value


def _tool_name(value: Any, name: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise _bad(name, "a tool name of 1-128 letters, digits, _ . : -", value)
    return value


def _tools(raw: Any, read: Any) -> tuple[Tool, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad("tools", "a list of tools", raw)
    tools = tuple(read(t, f"tools[{i}]") for i, t in enumerate(raw))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise RequestError("`tools` names a tool twice", param="tools")
    return tools


def _openai_tool(t: Any, where: str) -> Tool:
    if (
        not isinstance(t, dict)
        or t.get("type") != "function"
        or not isinstance(t.get("function"), dict)
    ):
        raise _bad(where, 'a {"type": "function", "function": {...}} tool', t)
    fn = t["function"]
    desc = fn.get("description") or ""
    if not isinstance(desc, str):
        raise _bad(f"{where}.function.description", "a string", desc)
    return Tool(
        _tool_name(fn.get("name"), f"{where}.function.name"),
        desc,
        _schema(fn.get("parameters"), f"{where}.function.parameters"),
    )


def openai_tool_use(body: dict[str, Any]) -> ToolUse:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat completion request."""
    tools = _tools(body.get("tools"), _openai_tool)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "true or false", parallel)
    raw = body.get("tool_choice")
    choice, name = ("auto" if tools else "none"), None
    if isinstance(raw, str) and raw in CHOICES:
        choice = raw
    elif (
        isinstance(raw, dict)
        and raw.get("type") == "function"
        and isinstance(raw.get("function"), dict)
    ):
        choice, name = "named", _tool_name(raw["function"].get("name"), "tool_choice")
    elif raw is not None:
        raise _bad("tool_choice", 'auto, none, required or {"type": "function", ...}', raw)
    return _checked(ToolUse(tools, choice, name, parallel is not False))


def _anthropic_tool(t: Any, where: str) -> Tool:
    if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
        kind = shown(t.get("type") if isinstance(t, dict) else t)
        raise RequestError(
            f"`{where}` is a {kind} tool; this server serves custom tools "
            "(name, description, input_schema) only",
            param=where,
        )
    desc = t.get("description") or ""
    if not isinstance(desc, str):
        raise _bad(f"{where}.description", "a string", desc)
    return Tool(
        _tool_name(t.get("name"), f"{where}.name"),
        desc,
        _schema(t.get("input_schema"), f"{where}.input_schema", required=True),
    )


def anthropic_tool_use(body: dict[str, Any]) -> ToolUse:
    """`tools` and `tool_choice` of a Messages request."""
    tools = _tools(body.get("tools"), _anthropic_tool)
    raw = body.get("tool_choice")
    if raw is None:
        return _checked(ToolUse(tools, "auto" if tools else "none"))
    kinds = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
    if not isinstance(raw, dict) or raw.get("type") not in kinds:
        raise _bad("tool_choice", 'an object with "type" auto, any, tool or none', raw)
    name = _tool_name(raw.get("name"), "tool_choice.name") if raw["type"] == "tool" else None
    single = raw.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise _bad("tool_choice.disable_parallel_tool_use", "true or false", single)
    return _checked(ToolUse(tools, kinds[raw["type"]], name, not single))


def _checked(use: ToolUse) -> ToolUse:
    if use.choice in ("required", "named") and not use.tools:
        raise RequestError(f"`tool_choice` {use.choice} needs `tools`", param="tool_choice")
    if use.choice == "named" and not use.forced():
        raise RequestError(
            f"`tool_choice` names {shown(use.name)}, which is not in `tools`", param="tool_choice"
        )
    return use


def arguments(raw: Any, where: str) -> dict[str, Any] | str:
    """Tool-call arguments from the history: a JSON object (or its text), kept as given."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise _bad(where, "a JSON object or its text", raw)
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw


def openai_tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad(where, "a list of tool calls", raw)
    calls = []
    for i, c in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
            raise _bad(at, 'a {"id", "type": "function", "function": {...}} call', c)
        fn = c["function"]
        name = _tool_name(fn.get("name"), f"{at}.function.name")
        args = arguments(fn.get("arguments", "{}"), f"{at}.function.arguments")
        calls.append(ToolCall(str(c.get("id") or f"call_{i}"), name, args))
    return tuple(calls)


def response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI `response_format`: None (text), or the JSON schema the answer must follow."""
    raw = body.get("response_format")
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise _bad("response_format.json_schema", 'an object with "name" and "schema"', spec)
        return dict(spec.get("schema") or {})
    raise _bad("response_format", 'an object with "type" text, json_object or json_schema', raw)
