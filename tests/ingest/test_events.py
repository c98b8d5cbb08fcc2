"""The event contract: every type round-trips, and every kind of bad input becomes InvalidEvent
(arbitrary and mutated input, by property: ``test_events_properties``)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from ingest import (
    EVENT_TYPES,
    FEEDBACK_TYPES,
    SCHEMA_VERSION,
    EventTooLarge,
    GenerationEvent,
    GenerationPayload,
    UnsupportedSchemaVersion,
    event_to_json,
    parse_event,
)
from ingest.events import EVENT_CLASSES, MAX_EVENT_BYTES, MAX_JSON_DEPTH
from ingest.payloads import (
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    MAX_TOOL_CALLS,
    MAX_TOTAL_TEXT_CHARS,
    MAX_TRAJECTORY_SEGMENTS,
)
from tests.ingest.event_samples import payloads, reason_of, sample_event


def test_every_event_type_has_a_sample_and_a_class() -> None:
    assert set(payloads()) == set(EVENT_TYPES) == set(EVENT_CLASSES)
    assert len(EVENT_TYPES) == len(set(EVENT_TYPES))


def test_feedback_types_are_exactly_those_referring_to_a_generation() -> None:
    referring = {name for name, payload in payloads().items() if "generation_id" in payload}
    assert set(FEEDBACK_TYPES) == referring - {"generation"}


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_every_type_round_trips_through_json(event_type: str) -> None:
    raw = json.dumps(sample_event(event_type)).encode()
    event = parse_event(raw)
    assert type(event) is EVENT_CLASSES[event_type]
    assert json.loads(event_to_json(event)) == sample_event(event_type)
    assert parse_event(event_to_json(event)) == event
    assert parse_event(event_to_json(event).decode()) == event
    assert parse_event(sample_event(event_type)) == event


def test_serialisation_is_compact_and_in_model_order() -> None:
    text = event_to_json(parse_event(sample_event("rating"))).decode()
    assert " " not in text
    assert text.startswith('{"event_id":"6f1c1f5e-8d3e-4d0a-b5a4-2f8e4f1d9c10","schema_version":2,"type":"rating"')


def test_timestamps_are_converted_to_and_written_in_utc() -> None:
    data = sample_event("rating") | {"ts": "2025-01-31T14:00:00+02:00"}
    event = parse_event(data)
    assert event.ts == datetime(2025, 1, 31, 12, 0, tzinfo=UTC)
    assert event.ts.utcoffset() == timedelta(0)
    assert json.loads(event_to_json(event))["ts"] == "2025-01-31T12:00:00Z"


@pytest.mark.parametrize(
    ("ts", "needle"),
    [
        ("2025-01-31T12:00:00", "naive timestamps are rejected"),
        (1738324800, "ISO 8601"),
        ("1738324800", "ISO 8601"),
        ("yesterday", "ISO 8601"),
        ("0001-01-01T00:00:00+01:00", "out of range"),
    ],
)
def test_bad_timestamps_are_rejected(ts: object, needle: str) -> None:
    error = reason_of(sample_event("rating") | {"ts": ts})
    assert error.field == "ts"
    assert needle in error.reason


def test_python_construction_fills_the_envelope_defaults() -> None:
    payload = GenerationPayload(
        generation_id=uuid.uuid4(), model="m", policy_version=0, prompt="", completion="", surface="ide.tab"
    )
    event = GenerationEvent(session_id="s", user_id="u", payload=payload)
    assert event.type == "generation"
    assert event.schema_version == SCHEMA_VERSION
    assert event.tenant == "default"
    assert event.privacy_mode is False
    assert event.ts.tzinfo is not None
    assert event.event_id.version == 4
    assert parse_event(event_to_json(event)) == event


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ((), "colour"),
        (("payload",), "colour"),
        (("payload", "tool_calls", 0), "colour"),
        (("payload", "trajectory", 1), "colour"),
    ],
)
def test_unknown_fields_are_rejected_everywhere(path: tuple[str | int, ...], field: str) -> None:
    data = sample_event("generation")
    target: Any = data
    for step in path:
        target = target[step]
    target[field] = "blue"
    error = reason_of(data)
    expected = ".".join(str(step) for step in (*path, field)).replace(".0", "[0]").replace(".1", "[1]")
    assert error.field == expected
    assert "unknown field" in error.reason


def test_unknown_type_lists_the_known_types() -> None:
    error = reason_of(sample_event("rating") | {"type": "foo"})
    assert error.reason.startswith("unknown event type 'foo'; known types: session.started, generation")
    assert error.field == "type"


@pytest.mark.parametrize(("value", "needle"), [(None, "got null"), (3, "got a number"), (["rating"], "got an array")])
def test_type_must_be_a_string(value: object, needle: str) -> None:
    assert needle in reason_of(sample_event("rating") | {"type": value}).reason


def test_missing_type_is_named() -> None:
    data = sample_event("rating")
    del data["type"]
    assert "required field 'type' is missing" in reason_of(data).reason


def test_newer_schema_version_names_both_versions() -> None:
    error = reason_of(sample_event("rating") | {"schema_version": SCHEMA_VERSION + 1})
    assert isinstance(error, UnsupportedSchemaVersion)
    assert error.reason == (
        f"schema_version {SCHEMA_VERSION + 1} is newer than this ingest supports ({SCHEMA_VERSION}); upgrade liveloop"
    )
    with pytest.raises(ValidationError, match="newer than this ingest supports"):
        EVENT_CLASSES["rating"].model_validate(sample_event("rating") | {"schema_version": 99})


@pytest.mark.parametrize("version", [0, -1, "1", True, 1.0])
def test_invalid_schema_versions_are_rejected(version: object) -> None:
    assert reason_of(sample_event("rating") | {"schema_version": version}).field == "schema_version"


@pytest.mark.parametrize(
    ("event_type", "field", "value", "needle"),
    [
        ("generation", "prompt", ["a", "list"], "Input should be a valid string, got an array"),
        ("generation", "policy_version", "3", "valid integer, got a string"),
        ("generation", "policy_version", 3.0, "valid integer"),
        ("generation", "policy_version", -1, "greater than or equal to 0"),
        ("generation", "prompt_token_ids", [1, -2], "greater than or equal to 0"),
        ("generation", "prompt_token_ids", "1,2", "valid list"),
        ("generation", "latency_ms", "fast", "valid number"),
        ("generation", "generation_id", "not-a-uuid", "UUID"),
        ("generation", "surface", "IDE Tab", "should match pattern"),
        ("tests.result", "passed", -1, "greater than or equal to 0"),
        ("tests.result", "failed", 1.5, "valid integer"),
        ("followup", "dissatisfied", 1, "valid boolean"),
        ("followup", "rephrase", "true", "valid boolean"),
        ("rating", "thumbs", "sideways", "'up' or 'down'"),
        ("edit.persisted", "fraction_remaining", 1.5, "less than or equal to 1"),
        ("edit.reverted", "seconds_after", -3, "greater than or equal to 0"),
        ("tool.result", "call_index", MAX_TOOL_CALLS, "less than"),
    ],
)
def test_wrong_payload_values_name_the_field(event_type: str, field: str, value: object, needle: str) -> None:
    data = sample_event(event_type)
    data["payload"][field] = value
    error = reason_of(data)
    assert error.field is not None
    assert error.field.startswith(f"payload.{field}")  # or an element of it: payload.prompt_token_ids[1]
    assert error.reason.startswith(f"field '{error.field}': ")
    assert needle in error.reason


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("session_id", ""),
        ("session_id", "x" * 129),
        ("session_id", "line\nbreak"),
        ("user_id", 42),
        ("tenant", "Acme Corp"),
        ("privacy_mode", "no"),
        ("event_id", "123"),
        ("payload", "text"),
    ],
)
def test_wrong_envelope_values_name_the_field(field: str, value: object) -> None:
    assert reason_of(sample_event("rating") | {field: value}).field == field


@pytest.mark.parametrize(
    ("path", "field"),
    [((), "session_id"), ((), "payload"), (("payload",), "generation_id"), (("payload",), "model")],
)
def test_missing_fields_are_named(path: tuple[str, ...], field: str) -> None:
    data = sample_event("generation")
    target: Any = data
    for step in path:
        target = target[step]
    del target[field]
    error = reason_of(data)
    assert error.field == ".".join((*path, field))
    assert "required field is missing" in error.reason


def test_logprobs_must_align_with_completion_tokens() -> None:
    data = sample_event("generation")
    data["payload"]["completion_logprobs"] = [-0.5]
    error = reason_of(data)
    assert error.field == "payload"
    assert "completion has 1 logprobs but 2 token ids" in error.reason


def test_logprobs_must_align_within_a_trajectory_segment() -> None:
    data = sample_event("generation")
    data["payload"]["trajectory"][1]["logprobs"] = [-0.1, -0.2, -0.3]
    error = reason_of(data)
    assert error.field == "payload.trajectory[1]"
    assert "segment has 3 logprobs but 2 token ids" in error.reason


@pytest.mark.parametrize("bad", [0.5, float("inf"), float("-inf"), float("nan")])
def test_logprobs_must_be_finite_and_not_positive(bad: float) -> None:
    data = sample_event("generation")
    data["payload"]["completion_logprobs"] = [-0.1, bad]
    assert reason_of(data).field == "payload.completion_logprobs[1]"


def test_trajectory_role_is_checked() -> None:
    data = sample_event("generation")
    data["payload"]["trajectory"][0]["role"] = "assistant"
    assert reason_of(data).field == "payload.trajectory[0].role"


def test_lone_surrogates_are_rejected() -> None:
    data = sample_event("generation")
    data["payload"]["prompt"] = "bad \ud800 text"
    for form in (data, json.dumps(data)):
        error = reason_of(form)
        assert error.field == "payload.prompt"
        assert "surrogate" in error.reason


def test_invalid_utf8_names_the_byte() -> None:
    raw = json.dumps(sample_event("rating")).encode().replace(b"sess-1", b"sess-\xff")
    error = reason_of(raw)
    assert "not valid UTF-8" in error.reason
    assert "0xff" in error.reason


def _with_nul(where: str) -> dict[str, Any]:
    event = sample_event("generation")
    if where == "key":
        event["payload"]["a\x00"] = 1
    elif where == "envelope":
        event["user_id"] = "u\x00"
    else:
        event["payload"]["prompt"] = "def f():\x00"
    return event


@pytest.mark.parametrize(
    ("where", "field"), [("prompt", "payload.prompt"), ("envelope", "user_id"), ("key", "payload")]
)
@pytest.mark.parametrize("form", ["bytes", "str", "dict"])
def test_a_nul_is_refused_on_every_path_and_its_field_named(where: str, field: str, form: str) -> None:
    # PostgreSQL cannot keep a NUL: accepted here, such an event would be lost to the archiver's dead letters.
    event = _with_nul(where)
    data = {"bytes": json.dumps(event).encode(), "str": json.dumps(event), "dict": event}[form]
    error = reason_of(data)
    assert "NUL character" in error.reason
    assert error.field == field
    assert field in error.reason


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    event = sample_event("generation")
    event["payload"]["prompt"] = "print('\\u0000')"  # the six characters \u0000, as code often has them
    assert parse_event(json.dumps(event)).payload.prompt == "print('\\u0000')"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "malformed JSON"),
        (b"{", "malformed JSON"),
        (b'{"type": "rating",}', "malformed JSON"),
        (b'{"type": "rating"} trailing', "malformed JSON"),
        (b'{"a": NaN}', "NaN is not a valid JSON number"),
        (b'{"a": -Infinity}', "-Infinity is not a valid JSON number"),
        (b'{"type": "rating", "type": "foo"}', "key 'type' appears twice"),
        (b"null", "must be a JSON object, got null"),
        (b"[]", "must be a JSON object, got an array"),
        (b'"rating"', "must be a JSON object, got a string"),
        (b"1" * 5000, "malformed JSON"),
    ],
)
def test_malformed_json_is_explained(raw: bytes, needle: str) -> None:
    assert needle in reason_of(raw).reason


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 10_000 + "]" * 10_000,
        '{"a":' * 10_000 + "1" + "}" * 10_000,
        "[" * 10_000,
        '{"type": "rating", "payload": ' + "[" * 10_000 + "]" * 10_000 + "}",
    ],
)
def test_deep_nesting_is_rejected_without_recursion_error(raw: str) -> None:
    for form in (raw, raw.encode()):
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in reason_of(form).reason


def test_deeply_nested_dict_is_rejected_without_recursion_error() -> None:
    nested: dict[str, Any] = {}
    deep = nested
    for _ in range(10_000):
        deep["a"] = {}
        deep = deep["a"]
    data = sample_event("rating") | {"payload": nested}
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in reason_of(data).reason


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    data = sample_event("generation")
    data["payload"]["prompt"] = "[{" * 5_000 + '"\\'
    assert parse_event(json.dumps(data)).payload.prompt == data["payload"]["prompt"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt", "x" * (MAX_TEXT_CHARS + 1)),
        ("completion_token_ids", [1] * (MAX_TOKENS + 1)),
        ("tool_calls", [{"name": "t", "arguments": "{}"}] * (MAX_TOOL_CALLS + 1)),
        ("trajectory", [{"role": "user", "text": "hi"}] * (MAX_TRAJECTORY_SEGMENTS + 1)),
    ],
)
def test_oversized_fields_raise_event_too_large(field: str, value: object) -> None:
    data = sample_event("generation")
    data["payload"][field] = value
    data["payload"]["completion_logprobs"] = None
    error = reason_of(json.dumps(data))
    assert isinstance(error, EventTooLarge)
    assert error.field == f"payload.{field}"
    assert "at most" in error.reason


def test_total_text_of_a_generation_is_bounded() -> None:
    data = sample_event("generation")
    segments = MAX_TOTAL_TEXT_CHARS // MAX_TEXT_CHARS + 1
    data["payload"]["trajectory"] = [{"role": "tool", "text": "y" * MAX_TEXT_CHARS}] * segments
    error = reason_of(data)
    assert isinstance(error, EventTooLarge)
    assert f"over the limit of {MAX_TOTAL_TEXT_CHARS}" in error.reason


def test_oversized_raw_event_is_rejected_before_decoding() -> None:
    error = reason_of(b" " * (MAX_EVENT_BYTES + 1))
    assert isinstance(error, EventTooLarge)
    assert str(MAX_EVENT_BYTES) in error.reason


@pytest.mark.parametrize(
    ("spans", "needle"),
    [
        ([{"start": 4, "end": 4, "passed": True}], "span end 4 must be after its start 4"),
        ([{"start": -1, "end": 4, "passed": True}], "greater than or equal to 0"),
        ([{"start": 0, "end": 4, "passed": "yes"}], "valid boolean"),
        (
            [{"start": 6, "end": 9, "passed": True}, {"start": 0, "end": 7, "passed": False}],
            "spans [0, 7) and [6, 9) overlap",
        ),
    ],
)
def test_a_checks_spans_must_be_well_formed_and_apart(spans: list[dict[str, object]], needle: str) -> None:
    data = sample_event("tests.result")
    data["payload"]["spans"] = spans
    error = reason_of(data)
    assert error.field is not None
    assert error.field.startswith("payload")
    assert needle in error.reason


def test_a_check_with_spans_apart_is_accepted() -> None:
    data = sample_event("tests.result")
    data["payload"]["spans"] = [{"start": 8, "end": 14, "passed": False}, {"start": 0, "end": 7, "passed": True}]
    event = parse_event(json.dumps(data).encode())
    assert [(s.start, s.end, s.passed) for s in event.payload.spans] == [(8, 14, False), (0, 7, True)]


def test_reason_counts_further_errors_and_stays_short() -> None:
    data = sample_event("tests.result")
    data["payload"] |= {"passed": -1, "failed": -1}
    data["x" * 10_000] = 1
    error = reason_of(data)
    assert "(and 2 more errors)" in error.reason
    assert len(error.reason) < 300


def test_unsupported_input_type_is_invalid() -> None:
    assert "cannot parse an event from int" in reason_of(42).reason  # type: ignore[arg-type]


def test_importing_ingest_stays_light() -> None:
    heavy = ["torch", "faust", "mlflow", "deepspeed", "fastapi", "transformers", "psycopg"]
    code = (
        "import sys, ingest, ingest.redaction, ingest.schema_export\n"
        f"print([name for name in {heavy!r} if name in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_other_offsets_are_accepted() -> None:
    ts = datetime(2025, 6, 1, 8, 30, tzinfo=timezone(timedelta(hours=-5, minutes=-30)))
    event = parse_event(sample_event("rating") | {"ts": ts.isoformat()})
    assert event.ts == ts
    assert json.loads(event_to_json(event))["ts"] == "2025-06-01T14:00:00Z"
