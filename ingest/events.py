"""The versioned event envelope of the ``liveloop.events`` topic, and parsing and serialising it.

Every event is one JSON object: an envelope (id, schema version, type, time, session, user, tenant,
privacy flag) and a ``payload`` whose model the ``type`` selects (see :mod:`ingest.payloads`).
Consumers import :data:`Event` and :func:`parse_event` from here; this module is the contract.

Decisions a producer must know:

- ``event_id`` is the idempotency key: a retried send must reuse it, consumers drop duplicates.
- ``ts`` must carry a UTC offset (``...Z`` or ``...+02:00``). Naive timestamps are *rejected*, not
  assumed UTC: a local time mislabelled as UTC would silently shift reward windows by hours.
  Timestamps are converted to UTC on parsing and always serialised in UTC (``...Z``). Numbers
  (Unix epochs) are rejected too, so that seconds and milliseconds cannot be confused.
- ``schema_version`` newer than :data:`SCHEMA_VERSION` is rejected (:class:`UnsupportedSchemaVersion`);
  unknown fields are rejected everywhere, so a typo never silently drops a signal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast
from uuid import UUID, uuid4

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)
from pydantic.config import JsonDict

from ingest.decoding import JSON_NUL, invalid_from, json_type, load_json, nested_deeper_than, reject_nul, shorten
from ingest.errors import EventTooLarge, InvalidEvent, UnsupportedSchemaVersion
from ingest.payloads import (
    MAX_ID_CHARS,
    ContractModel,
    EditPayload,
    FeedbackPayload,
    FollowupPayload,
    GenerationPayload,
    RatingPayload,
    SessionEndedPayload,
    SessionStartedPayload,
    SuggestionPayload,
    TestsResultPayload,
    ToolResultPayload,
    TrajectoryOutcomePayload,
)

SCHEMA_VERSION = 2
"""The event schema version this code writes and the newest it accepts. Version 2 added agent turns
(``GenerationPayload.turn``) and ``trajectory.outcome``; every version-1 event is still valid."""
MAX_EVENT_BYTES = 16 * 1024 * 1024
"""Largest serialised event accepted; the events topic's ``max.message.bytes`` must allow it."""
MAX_JSON_DEPTH = 32
"""Deepest JSON nesting accepted; real events are about five levels deep."""
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"

_ID_PATTERN = r"^[^\x00-\x1F\x7F]+$"
_ISO_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _iso_only(value: object) -> object:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and _ISO_DATETIME.match(value):
        return value
    raise ValueError("must be an ISO 8601 date-time string with a UTC offset, e.g. '2025-01-31T12:00:00Z'")


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC") from None


Timestamp = Annotated[AwareDatetime, BeforeValidator(_iso_only), AfterValidator(_to_utc)]


def _newer_version_message(version: int) -> str:
    shown = str(version) if version < 10**18 else "(a huge number)"
    return f"schema_version {shown} is newer than this ingest supports ({SCHEMA_VERSION}); upgrade liveloop"


def _type_required(schema: JsonDict) -> None:
    # ``type`` has a default so that Python callers need not repeat the class, but on the wire it is
    # the discriminator and must be present.
    required = schema.setdefault("required", [])
    if isinstance(required, list) and "type" not in required:
        required.insert(0, "type")


class EventBase(ContractModel):
    """The envelope every event shares; subclasses fix ``type`` and the payload model."""

    model_config = ConfigDict(json_schema_extra=_type_required)

    event_id: UUID = Field(default_factory=uuid4, strict=False, description="Idempotency key.")
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1)
    type: str
    ts: Timestamp = Field(default_factory=_utc_now, strict=False, description="When it happened, UTC.")
    session_id: str = Field(min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_PATTERN)
    user_id: str = Field(
        min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_PATTERN, description="Pseudonymous user id."
    )
    tenant: str = Field(default="default", pattern=TENANT_PATTERN)
    privacy_mode: bool = Field(default=False, description="Never archive, distill or train on this event.")

    @field_validator("schema_version")
    @classmethod
    def _not_newer(cls, version: int) -> int:
        if version > SCHEMA_VERSION:
            raise ValueError(_newer_version_message(version))
        return version


class SessionStartedEvent(EventBase):
    """A session started."""

    type: Literal["session.started"] = "session.started"
    payload: SessionStartedPayload


class GenerationEvent(EventBase):
    """The model produced an output (emitted by the serving gateway)."""

    type: Literal["generation"] = "generation"
    payload: GenerationPayload


class SuggestionAcceptedEvent(EventBase):
    """The user accepted a suggestion."""

    type: Literal["suggestion.accepted"] = "suggestion.accepted"
    payload: SuggestionPayload


class SuggestionRejectedEvent(EventBase):
    """The user explicitly rejected a suggestion."""

    type: Literal["suggestion.rejected"] = "suggestion.rejected"
    payload: SuggestionPayload


class SuggestionDismissedEvent(EventBase):
    """The suggestion went away unused (the user typed on, pressed escape, moved away)."""

    type: Literal["suggestion.dismissed"] = "suggestion.dismissed"
    payload: SuggestionPayload


class EditPersistedEvent(EventBase):
    """An accepted edit was still (partly) present some time later."""

    type: Literal["edit.persisted"] = "edit.persisted"
    payload: EditPayload


class EditRevertedEvent(EventBase):
    """An accepted edit was (mostly) undone or rewritten."""

    type: Literal["edit.reverted"] = "edit.reverted"
    payload: EditPayload


class FollowupEvent(EventBase):
    """The user followed up on a generation."""

    type: Literal["followup"] = "followup"
    payload: FollowupPayload


class RatingEvent(EventBase):
    """The user rated a generation."""

    type: Literal["rating"] = "rating"
    payload: RatingPayload


class ToolResultEvent(EventBase):
    """One of a generation's tool calls was executed."""

    type: Literal["tool.result"] = "tool.result"
    payload: ToolResultPayload


class TestsResultEvent(EventBase):
    """Tests ran after a generation was applied."""

    __test__ = False  # not a pytest test class, despite the name

    type: Literal["tests.result"] = "tests.result"
    payload: TestsResultPayload


class TrajectoryOutcomeEvent(EventBase):
    """An agent trajectory ended with a verified outcome (sent by the product, in the trajectory's session)."""

    type: Literal["trajectory.outcome"] = "trajectory.outcome"
    payload: TrajectoryOutcomePayload


class SessionEndedEvent(EventBase):
    """The session ended."""

    type: Literal["session.ended"] = "session.ended"
    payload: SessionEndedPayload


Event = Annotated[
    SessionStartedEvent
    | GenerationEvent
    | SuggestionAcceptedEvent
    | SuggestionRejectedEvent
    | SuggestionDismissedEvent
    | EditPersistedEvent
    | EditRevertedEvent
    | FollowupEvent
    | RatingEvent
    | ToolResultEvent
    | TestsResultEvent
    | TrajectoryOutcomeEvent
    | SessionEndedEvent,
    Field(discriminator="type"),
]
"""Any event of the contract; ``type`` selects the class."""

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
EVENT_CLASSES: Mapping[str, type[EventBase]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        SessionStartedEvent,
        GenerationEvent,
        SuggestionAcceptedEvent,
        SuggestionRejectedEvent,
        SuggestionDismissedEvent,
        EditPersistedEvent,
        EditRevertedEvent,
        FollowupEvent,
        RatingEvent,
        ToolResultEvent,
        TestsResultEvent,
        TrajectoryOutcomeEvent,
        SessionEndedEvent,
    )
}
"""Event class by type name."""
EVENT_TYPES: tuple[str, ...] = tuple(EVENT_CLASSES)
"""Every event type name, in contract order."""
FEEDBACK_TYPES: tuple[str, ...] = tuple(
    name
    for name, cls in EVENT_CLASSES.items()
    if issubclass(cast(type, cls.model_fields["payload"].annotation), FeedbackPayload)
)
"""The types whose payload refers to a generation by ``generation_id``."""


def parse_event(data: bytes | bytearray | str | Mapping[str, Any]) -> Event:
    """Parse and validate one event from raw JSON (bytes or str) or an already decoded dict.

    Every failure raises :class:`InvalidEvent` (or a subclass) with a one-line reason naming the
    problem; nothing else escapes, whatever the input.
    """
    if isinstance(data, bytes | bytearray):
        _check_size(len(data))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = data[exc.start]
            raise InvalidEvent(f"event is not valid UTF-8: byte 0x{bad:02x} at offset {exc.start}") from exc
        return _from_text(text)
    if isinstance(data, str):
        _check_size(len(data))
        return _from_text(data)
    if isinstance(data, Mapping):
        if nested_deeper_than(data, MAX_JSON_DEPTH):
            raise InvalidEvent(f"event is nested deeper than {MAX_JSON_DEPTH} levels")
        reject_nul(data)
        return _validate(data)
    raise InvalidEvent(f"cannot parse an event from {type(data).__name__}; pass JSON bytes, str or a dict")


def event_to_json(event: Event) -> bytes:
    """Serialise an event as compact UTF-8 JSON, keys in model order, timestamps in UTC."""
    # The event class's own serializer writes the same bytes as EVENT_ADAPTER.dump_json without
    # dispatching on the union first, several times faster; the SDK serialises every event here.
    return type(event).__pydantic_serializer__.to_json(event)


def _from_text(text: str) -> Event:
    data = load_json(text, MAX_JSON_DEPTH)
    if "\\u0000" in text and JSON_NUL.search(text):  # the substring test is cheap; the pattern is exact
        reject_nul(data)
    return _validate(data)


def _check_size(size: int) -> None:
    if size > MAX_EVENT_BYTES:
        raise EventTooLarge(
            f"event is {size} bytes, over the limit of {MAX_EVENT_BYTES} (MAX_EVENT_BYTES); "
            "truncate the prompt, completion or trajectory"
        )


def _validate(data: object) -> Event:
    if not isinstance(data, Mapping):
        raise InvalidEvent(f"an event must be a JSON object, got {json_type(data)}")
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise UnsupportedSchemaVersion(_newer_version_message(version), field="schema_version")
    if "type" not in data:
        raise InvalidEvent(f"required field 'type' is missing; known types: {', '.join(EVENT_TYPES)}", "type")
    name = data["type"]
    if not isinstance(name, str):
        raise InvalidEvent(f"field 'type' must be a string, got {json_type(name)}", "type")
    cls = EVENT_CLASSES.get(name)
    if cls is None:
        known = ", ".join(EVENT_TYPES)
        raise InvalidEvent(f"unknown event type {shorten(name)!r}; known types: {known}", "type")
    try:
        return cast("Event", cls.model_validate(data if isinstance(data, dict) else dict(data)))
    except ValidationError as exc:
        raise invalid_from(exc) from exc
