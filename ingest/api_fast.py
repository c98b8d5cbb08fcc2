"""The fast path of event validation: a body whose every event is valid is validated in one call.

Used by the HTTP ingest API (:func:`validate_clean_body`) and by the distiller, which reads every
event of the events topic (:func:`parse_clean_event`).

Most request bodies are clean batches. For those, pydantic validates the raw bytes straight into
events (``TypeAdapter(list[Event]).validate_json``), about twice as fast as decoding the JSON into
Python objects and validating every item from them. :func:`validate_clean_body` answers either the
events, when it can prove that the exact path (:func:`ingest.api_batch.decode_body` and
:func:`ingest.api_batch.judge_items`) would accept every one of them unchanged, or ``None``, and the
caller then runs the exact path, which finds the problems and words the reasons. Whatever the input,
the fast path never accepts what the exact path rejects; it may only give up.

What the fast path checks beyond pydantic, because the JSON parser does not: duplicate keys (the
exact path rejects them as ambiguous). The count of ``:`` outside strings is the number of keys in
the body; every JSON object of a valid body became a model, and a model's ``model_fields_set`` holds
each key once, so a duplicated key shows as more colons than fields set.
"""

from __future__ import annotations

import re
from functools import cache
from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin
from uuid import UUID

from pydantic import BaseModel, TypeAdapter, ValidationError

from ingest.events import MAX_EVENT_BYTES, TENANT_PATTERN, Event

_BATCH: TypeAdapter[list[Event]] = TypeAdapter(list[Event])
_SINGLE: TypeAdapter[Event] = TypeAdapter(Event)
_TENANT = re.compile(TENANT_PATTERN)
_JSON_SPACE = b" \t\r\n"


def validate_clean_body(raw: bytes, tenant: str, max_items: int) -> tuple[list[Event], bool] | None:
    """The events of ``raw`` and whether it was a batch, or ``None`` if the exact path must judge it.

    Events come back with the key's ``tenant`` filled in where they named none; ``None`` is also the
    answer for anything the exact path treats specially: a body too deep or too long, a malformed or
    invalid event, another tenant, a repeated ``event_id``, a duplicated key or a NUL escape.
    """
    if b"\\u0000" in raw:  # maybe a NUL, which the exact path rejects with its field named
        return None
    is_batch = raw.lstrip(_JSON_SPACE)[:1] == b"["
    if not is_batch and raw.lstrip(_JSON_SPACE)[:1] != b"{":
        return None
    # No depth scan first: the parser has its own recursion limit, and no event of the contract nests
    # anywhere near MAX_JSON_DEPTH, so a body too deep for the exact path never validates here.
    try:
        events = _BATCH.validate_json(raw) if is_batch else [_SINGLE.validate_json(raw)]
    except (ValidationError, ValueError, RecursionError):
        return None
    if len(events) > max_items or _key_count(raw) != sum(_keys(event) for event in events):
        return None
    if _TENANT.match(tenant) is None:
        return None
    filled: list[Event] = []
    seen: set[UUID] = set()
    for event in events:
        if "tenant" not in event.model_fields_set and event.tenant != tenant:
            event = event.model_copy(update={"tenant": tenant})
        if event.tenant != tenant or event.event_id in seen:
            return None
        seen.add(event.event_id)
        filled.append(event)
    return filled, is_batch


def parse_clean_event(raw: bytes) -> Event | None:
    """One event from its raw JSON, exactly as :func:`ingest.events.parse_event` reads it, or ``None``
    where ``parse_event`` must judge it (anything it might reject, or word a reason for)."""
    if len(raw) > MAX_EVENT_BYTES or b"\\u0000" in raw or raw.lstrip(_JSON_SPACE)[:1] != b"{":
        return None
    try:
        event = _SINGLE.validate_json(raw)
    except (ValidationError, ValueError, RecursionError):
        return None
    return event if _key_count(raw) == _keys(event) else None


def _key_count(raw: bytes) -> int:
    """The number of keys in valid JSON ``raw`` (duplicates included), or more, never fewer.

    A key is a string followed by ``:``. Where no whitespace stands before a colon, every key ends in
    ``":`` and C-level counts find them all. Inside a string, ``":`` is an escaped quote (``\\":``,
    common in tool-call arguments, which are JSON themselves) and is taken off; a string value that
    starts with a colon is still counted, which only makes the check fail safe.
    """
    if any(space in raw for space in _SPACE_COLONS):
        # Escaped backslashes first, then escaped quotes: what is left of '"' delimits strings, and every
        # colon outside them separates a key from its value.
        plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_QUOTE_OR_COLON)
        return b"".join(plain.split(b'"')[::2]).count(b":")
    count = raw.count(b'":')
    if b'\\"' in raw:
        # A quote is escaped when an odd number of backslashes precede it. count() of "k backslashes,
        # then a quote and a colon" is the number of such quotes with at least k backslashes before
        # them (occurrences cannot overlap), so the alternating sum counts exactly the escaped ones.
        prefix, sign = b"\\", 1
        while (found := raw.count(prefix + b'":')) > 0:
            count -= sign * found
            prefix, sign = prefix + b"\\", -sign
    return count


_SPACE_COLONS = (b" :", b"\t:", b"\n:", b"\r:")
_NOT_QUOTE_OR_COLON = bytes(byte for byte in range(256) if byte not in b'":')


def _keys(model: BaseModel) -> int:
    """How many JSON keys the objects that became ``model`` and its nested models held, each once."""
    count = len(model.model_fields_set)
    for name in _nested_fields(type(model)):
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            count += _keys(value)
        elif isinstance(value, list):
            count += sum(_keys(item) for item in value if isinstance(item, BaseModel))
    return count


@cache
def _nested_fields(model_type: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model_type`` that hold models or lists (where nested JSON objects end up)."""
    return tuple(name for name, info in model_type.model_fields.items() if not _scalar(info.annotation))


def _scalar(annotation: object) -> bool:
    """Whether a field of this type holds only JSON scalars or lists of them (never an object).

    Unsure answers are False, which only costs a look at the value: a model counted as a scalar
    would make the key count come out short, and the body would go the exact way, never wrongly in.
    """
    origin = get_origin(annotation)
    if origin is None:
        return isinstance(annotation, type) and not issubclass(annotation, BaseModel | list | dict | tuple | set)
    args = get_args(annotation)
    if origin is Annotated:
        return _scalar(args[0])
    if origin is Literal:
        return all(isinstance(arg, str | int | bool) for arg in args)
    if origin is list or origin is Union or origin is UnionType:
        return all(arg is type(None) or _scalar(arg) for arg in args)
    return False
