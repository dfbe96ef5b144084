"""Request bodies to JSON objects with limits: nesting depth, integer size, valid Unicode.

Python's `json` accepts things a server must not pass on: nesting deep enough to
raise RecursionError, integer literals past Python's digit limit (ValueError),
`NaN`/`Infinity`, `\\ud800`-style escapes that decode to lone surrogates, which
no tokenizer or UTF-8 encoder takes, and bodies in UTF-16 or UTF-32, which it would
detect and decode (JSON between systems is UTF-8, RFC 8259). Each is a RequestError
(400) naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

from edge0.errors import RequestError
from edge0.server.field_errors import described

MAX_DEPTH = 64  # nested objects/arrays, the body itself being level 1
MAX_INT = 1 << 64  # |integer| must stay below: the largest field (`seed`) is a uint64
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # after decoding, pairs are one code point


def parse_object(body: bytes) -> dict[str, Any]:
    """`body` as a JSON object, or a RequestError (400) that says what is wrong and where."""
    if not body.strip():
        raise RequestError("the request body is empty; send a JSON object")
    try:
        data = json.loads(_utf8(body), parse_constant=_constant)
    except RecursionError:
        raise _too_deep("the request body") from None
    except RequestError:
        raise
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        raise RequestError(f"the request body is not valid JSON: {_short(exc)}") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, not {described(data)}")
    check_value(data)
    return data


def _utf8(body: bytes) -> str:
    """The body as text: UTF-8 (a leading byte-order mark is dropped), nothing else."""
    if (nul := body.find(b"\x00")) >= 0:  # JSON text has no raw NUL: UTF-16 or UTF-32
        raise RequestError(
            f"the request body is not UTF-8 (a NUL byte at offset {nul}: UTF-16 or UTF-32?); "
            "send JSON as UTF-8"
        )
    try:
        return body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        at = exc.start
        what = f"byte 0x{body[at]:02x} at offset {at}"
        if body[at : at + 2] >= b"\xed\xa0" and body[at : at + 2] <= b"\xed\xbf":
            what = f"an encoded UTF-16 surrogate at offset {at}"  # ED A0..BF: U+D800..DFFF
        raise RequestError(f"the request body is not UTF-8 ({what}); send JSON as UTF-8") from None


def check_value(root: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH, huge integers and lone surrogates in `root`."""
    stack: list[tuple[Any, int, str]] = [(root, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            shown = where if len(where) <= 60 else where[:60] + "..."
            raise _too_deep(f"`{shown}`" if where else "the request body")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str):
                _check_str(key, f"{where}.{key!r}" if where else f"{key!r}", "a key")
                path = f"{where}.{key}" if where else key
            else:
                path = f"{where}[{key}]"
            kind = type(item)
            if kind is str:
                _check_str(item, path, "a string")
            elif kind is int and not -MAX_INT < item < MAX_INT:
                raise RequestError(
                    f"`{path}` is an integer of {len(str(abs(item)))} digits; "
                    f"integers here stay below 2**64",
                    param=path,
                )
            elif kind is dict or kind is list:
                stack.append((item, depth + 1, path))


def _check_str(text: str, path: str, what: str) -> None:
    if (bad := _LONE_SURROGATE.search(text)) is not None:
        raise RequestError(
            f"`{path}` is {what} with a lone UTF-16 surrogate (\\u{ord(bad.group()):04x} at "
            f"character {bad.start()}), which is not Unicode text; send valid UTF-8 or paired "
            "\\u escapes",
            param=path,
        )


def _constant(name: str) -> Any:
    raise RequestError(
        f"the request body is not valid JSON: {name} is not a JSON number; "
        "send a finite number or null"
    )


def _too_deep(what: str) -> RequestError:
    return RequestError(
        f"{what} nests objects and arrays more than {MAX_DEPTH} levels deep; flatten it"
    )


def _short(exc: ValueError) -> str:
    text = str(exc)
    if "integer string conversion" in text:
        return "an integer literal is longer than 4300 digits"
    return text[:200]
