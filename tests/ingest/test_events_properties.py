"""The event contract by property: whatever bytes, JSON or mutation of a valid event comes in, the parser
answers an event or InvalidEvent, never another exception; valid events round-trip exactly."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import (
    EVENT_TYPES,
    InvalidEvent,
    event_to_json,
    parse_event,
)
from ingest.events import MAX_JSON_DEPTH
from tests.ingest.event_samples import reason_of, sample_event

# The database is off so that runs leave no .hypothesis folder in the work tree.
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, database=None)
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


def _parse_or_invalid(data: bytes | str | dict[str, Any]) -> None:
    with contextlib.suppress(InvalidEvent):  # the only exception allowed
        parse_event(data)


@PROPERTY_SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_ever_raise_invalid_event(raw: bytes) -> None:
    _parse_or_invalid(raw)


@PROPERTY_SETTINGS
@given(JSON_VALUES)
def test_arbitrary_json_only_ever_raises_invalid_event(value: object) -> None:
    _parse_or_invalid(json.dumps(value))


@PROPERTY_SETTINGS
@given(st.sampled_from(EVENT_TYPES), st.data())
def test_mutated_events_only_ever_raise_invalid_event(event_type: str, data: st.DataObject) -> None:
    event = sample_event(event_type)
    target = data.draw(st.sampled_from([event, event["payload"]]))
    key = data.draw(st.sampled_from([*target, "extra"]))
    target[key] = data.draw(JSON_VALUES)
    _parse_or_invalid(json.dumps(event))
    _parse_or_invalid(event)


IDENTIFIERS = st.from_regex(r"[a-z][a-z0-9_.-]{0,15}", fullmatch=True)
IDS = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20)
TEXT = st.text(st.characters(blacklist_characters="\x00"), max_size=60)  # a NUL is refused (see above)
LOGPROBS = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
TOKEN_IDS = st.integers(min_value=0, max_value=2**31 - 1)
TIMESTAMPS = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1)).map(
    lambda ts: ts.replace(tzinfo=UTC)
)


@st.composite
def _tokens_with_logprobs(draw: st.DrawFn) -> tuple[list[int] | None, list[float] | None]:
    size = draw(st.integers(min_value=0, max_value=8))
    token_ids = draw(st.none() | st.lists(TOKEN_IDS, min_size=size, max_size=size))
    logprobs = draw(st.none() | st.lists(LOGPROBS, min_size=size, max_size=size))
    return token_ids, logprobs


@st.composite
def _generation_payloads(draw: st.DrawFn) -> dict[str, Any]:
    completion_ids, completion_logprobs = draw(_tokens_with_logprobs())
    segments = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        token_ids, logprobs = draw(_tokens_with_logprobs())
        role = draw(st.sampled_from(["policy", "tool", "subagent", "summary", "user"]))
        segments.append({"role": role, "text": draw(TEXT), "token_ids": token_ids, "logprobs": logprobs})
    calls = st.fixed_dictionaries({"name": IDS, "arguments": TEXT, "valid": st.none() | st.booleans()})
    return {
        "generation_id": str(draw(st.uuids())),
        "model": draw(IDS),
        "policy_version": draw(st.integers(min_value=0, max_value=2**40)),
        "prompt": draw(TEXT),
        "completion": draw(TEXT),
        "prompt_token_ids": draw(st.none() | st.lists(TOKEN_IDS, max_size=8)),
        "completion_token_ids": completion_ids,
        "completion_logprobs": completion_logprobs,
        "latency_ms": draw(st.none() | st.floats(min_value=0, allow_nan=False, allow_infinity=False)),
        "tool_calls": draw(st.lists(calls, max_size=3)),
        "surface": draw(IDENTIFIERS),
        "task_kind": draw(st.none() | IDENTIFIERS),
        "trajectory": draw(st.none() | st.just(segments)),
    }


@st.composite
def _events(draw: st.DrawFn) -> dict[str, Any]:
    event_type = draw(st.sampled_from(EVENT_TYPES))
    payload = draw(_generation_payloads()) if event_type == "generation" else sample_event(event_type)["payload"]
    if "generation_id" in payload:
        payload["generation_id"] = str(draw(st.uuids()))
    return {
        "event_id": str(draw(st.uuids())),
        "type": event_type,
        "ts": draw(TIMESTAMPS).isoformat(),
        "session_id": draw(IDS),
        "user_id": draw(IDS),
        "tenant": draw(st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True)),
        "privacy_mode": draw(st.booleans()),
        "payload": payload,
    }


@settings(max_examples=200, deadline=None, database=None)
@given(_events())
def test_valid_events_round_trip_exactly(data: dict[str, Any]) -> None:
    event = parse_event(json.dumps(data))
    raw = event_to_json(event)
    again = parse_event(raw)
    assert again == event
    assert event_to_json(again) == raw
    assert parse_event(data) == event


@PROPERTY_SETTINGS
@given(st.integers(min_value=1, max_value=2 * MAX_JSON_DEPTH), st.text(alphabet='[]{}"\\ab', max_size=12))
def test_nesting_limit_is_exact_whatever_the_strings_hold(depth: int, leaf: str) -> None:
    value: object = {"k[": leaf}
    for level in range(depth - 1):
        value = [leaf, value] if level % 2 else {leaf + "{": value}
    raw = json.dumps(value)
    if depth > MAX_JSON_DEPTH:
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in reason_of(raw).reason
    else:
        assert "nested" not in reason_of(raw).reason  # shallow enough: rejected for other reasons
