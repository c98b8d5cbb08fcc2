"""Decoding untrusted event JSON safely, and turning validation errors into actionable reasons.

Everything here raises :class:`~ingest.errors.InvalidEvent` (or a subclass) and nothing else: the
input comes straight from the network, and a crash in the ingest path would stall every producer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ingest.errors import EventTooLarge, InvalidEvent

# The JSON escape \u0000 (not an escaped backslash followed by "u0000"): PostgreSQL's text and jsonb
# cannot hold a NUL, so an event with one could never reach the audit store.
JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
JSON_NUL_BYTES = re.compile(JSON_NUL.pattern.encode())
NUL_REASON = "text holds a NUL character (\\u0000), which the audit store cannot keep; remove it"

_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
_OPENERS = frozenset(b"[{")
_SIZE_ERRORS = frozenset({"string_too_long", "too_long", "event_too_large"})
_MESSAGES = {
    "extra_forbidden": "unknown field; this version of the event contract does not define it",
    "missing": "required field is missing",
    "timezone_aware": "naive timestamps are rejected; add a UTC offset, e.g. '2025-01-31T12:00:00Z'",
    "string_unicode": "text contains a lone UTF-16 surrogate, which is not valid Unicode",
}


def load_json(text: str, max_depth: int) -> object:
    """Decode JSON text, rejecting nesting deeper than ``max_depth``, NaN/Infinity and duplicate keys."""
    # Counting brackets is cheap and almost always proves the nesting shallow without a scan.
    if text.count("[") + text.count("{") > max_depth and _text_nested_deeper_than(text, max_depth):
        raise InvalidEvent(f"JSON is nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise InvalidEvent(f"malformed JSON: {shorten(str(exc), 200)}") from exc
    except RecursionError as exc:  # unreachable after the depth check; kept as a last line
        raise InvalidEvent(f"JSON is nested deeper than {max_depth} levels") from exc


def nested_deeper_than(data: Mapping[str, Any], max_depth: int) -> bool:
    """Whether a decoded structure nests dicts/lists deeper than ``max_depth``."""
    # Iterative, so a pathological (even cyclic) structure cannot exhaust the interpreter stack.
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        children = node.values() if isinstance(node, Mapping) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, Mapping | list | tuple))
    return False


def reject_nul(data: object) -> None:
    """Raise InvalidEvent naming the first field (or key) of a decoded structure whose text holds a NUL."""
    stack: list[tuple[object, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                raise InvalidEvent(f"field '{path}': {NUL_REASON}" if path else NUL_REASON, path or None)
        elif isinstance(node, Mapping):
            for key, value in node.items():
                where = f"{path}.{shorten(str(key))}" if path else shorten(str(key))
                if isinstance(key, str) and "\x00" in key:
                    raise InvalidEvent(f"key of '{path or '(the event)'}': {NUL_REASON}", path or None)
                stack.append((value, where))
        elif isinstance(node, list | tuple):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node))


def invalid_from(exc: ValidationError) -> InvalidEvent:
    """Condense a pydantic ValidationError into one actionable :class:`InvalidEvent`.

    The reason names the first problem (a size problem first, if any) as
    ``field 'payload.passed': <what is wrong>`` and counts the others.
    """
    # Inputs are kept as references (never rendered) and only their JSON type is ever shown.
    errors = exc.errors(include_url=False, include_context=False, include_input=True)
    sized = [error for error in errors if error["type"] in _SIZE_ERRORS]
    error: ErrorDetails = (sized or errors)[0]
    field = ".".join(_loc_part(part) for part in error["loc"]).replace(".[", "[") or None
    message = _MESSAGES.get(error["type"], error["msg"]).removeprefix("Value error, ")
    if error["type"].endswith("_type"):
        message += f", got {json_type(error['input'])}"
    reason = f"field '{field}': {message}" if field else message
    if len(errors) > 1:
        reason += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return (EventTooLarge if sized else InvalidEvent)(shorten(reason, 1000), field)


def shorten(text: str, limit: int = 64) -> str:
    """``text`` cut to ``limit`` characters with control characters masked, safe to put in a reason."""
    printable = "".join(char if char.isprintable() else "?" for char in text[: limit + 1])
    return printable if len(printable) <= limit else printable[: limit - 1] + "…"


def json_type(value: object) -> str:
    """The JSON type name of a decoded value, for messages ("an array", "a number")."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def _text_nested_deeper_than(text: str, max_depth: int) -> bool:
    # Linear and without recursion: drop escaped backslashes and quotes, so that splitting on '"'
    # separates strings (odd pieces) from structure (even pieces), then follow only the brackets.
    plain = text.replace("\\\\", "").replace('\\"', "")
    structure = "".join(plain.split('"')[::2]).encode("ascii", "ignore").translate(None, _NOT_BRACKETS)
    depth = 0
    for bracket in structure:
        if bracket in _OPENERS:
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False


def _reject_constant(name: str) -> object:
    raise InvalidEvent(f"malformed JSON: {name} is not a valid JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Duplicate keys are ambiguous (parsers disagree on which wins), a classic smuggling vector.
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidEvent(f"malformed JSON: key {shorten(key)!r} appears twice in one object")
            seen.add(key)
    return result


def _loc_part(part: str | int) -> str:
    return f"[{part}]" if isinstance(part, int) else shorten(part)
