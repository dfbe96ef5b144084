"""Errors about one request field, in JSON's own words: `null`, `true`, `array`, never Python's."""

from __future__ import annotations

import json
from typing import Any

from edge0.errors import RequestError

SHOWN = 60  # characters of a bad value quoted in a message


def json_kind(value: Any) -> str:
    """The JSON type name of a parsed value (null, boolean, integer, number, string, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    kinds = ((int, "integer"), (float, "number"), (str, "string"), (list, "array"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "object")


def shown(value: Any) -> str:
    """`value` as JSON text, cut to SHOWN characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: shown escaped
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def bad(name: str, want: str, value: Any) -> RequestError:
    """A 400 naming field `name`: what it must be, what it is."""
    return RequestError(f"`{name}` must be {want}, not {described(value)}", param=name)


def described(value: Any) -> str:
    """`null`, `true`, `false`, or the kind and the value: `string "abc"`."""
    if value is None or isinstance(value, bool):
        return shown(value)
    return f"{json_kind(value)} {shown(value)}"


def missing(name: str) -> RequestError:
    return RequestError(f"`{name}` is required", param=name)
