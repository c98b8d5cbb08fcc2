"""What the HTTP ingest API does with a request body: decode it, judge every event, plan the writes.

Pure CPU work, no I/O, so it can run in a worker process (:mod:`ingest.api_workers`):
:func:`judge_body` runs :func:`decode_body`, which turns the raw body into a list of items (or
rejects the whole body), then :func:`judge_items`, which decides for each item whether it is
accepted and returns the records for the events topic, the dead letters for the DLQ topic and the
per-item results. The HTTP layer (:mod:`ingest.api`) then writes both and answers.

Decisions:

- A body is one event (a JSON object) or a batch (a JSON array of events). Problems with the body as
  a whole (not UTF-8, malformed JSON, nested too deep, neither object nor array, too many items)
  reject the whole request; problems with one event reject that event only.
- The key decides the tenant. An event without ``tenant`` gets the key's tenant; an event naming
  another tenant is rejected, never accepted.
- Within one batch an ``event_id`` may be accepted once; a repeat is rejected as a duplicate.
- Privacy-mode events are acknowledged but produce no record, and when rejected their dead letter
  keeps nothing that identifies the session (the rule is :meth:`ingest.dead_letters.DeadLetter.of`'s).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import cast
from uuid import UUID

from pydantic import ValidationError

from ingest.api_fast import validate_clean_body
from ingest.dead_letters import DeadLetter
from ingest.decoding import invalid_from, json_type, load_json, reject_nul
from ingest.errors import EventTooLarge, InvalidEvent, UnsupportedSchemaVersion
from ingest.events import EVENT_CLASSES, MAX_JSON_DEPTH, SCHEMA_VERSION, Event, parse_event
from ingest.payloads import MAX_ID_CHARS
from ingest.redaction import redact_event

RECORD_OVERHEAD_BYTES = 4096
"""Room kept in a Kafka record batch for its headers and for gzip's worst-case growth."""

# A structural depth check that runs in C: keep only quotes and brackets, drop strings, peel empty pairs.
_STRUCTURE = bytes(range(256)).translate(None, b'"[]{}')  # the bytes to delete: all but quotes and brackets
_EMPTY_PAIR = re.compile(rb"\[\]|\{\}")
_NO_DEPTH_LIMIT = 1 << 62  # load_json's own bracket scan is skipped: _nested_deeper_than ran already


class BodyTooLarge(EventTooLarge):
    """The request body, or the batch in it, is over a limit; ``received`` is what was read of it."""

    def __init__(self, reason: str, received: bytes, size: int) -> None:
        super().__init__(reason)
        self.received = received
        self.size = size


@dataclass(slots=True)
class Judgement:
    """The fate of every item of one request, and what must be written for it."""

    results: list[dict[str, object]] = field(default_factory=list)
    records: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    """(key, value) of every accepted, stored event, in request order: the events topic's records."""
    letters: list[DeadLetter] = field(default_factory=list)
    accepted: int = 0
    rejected: int = 0
    privacy_dropped: int = 0
    rejected_by_class: Counter[str] = field(default_factory=Counter)
    redactions: Counter[str] = field(default_factory=Counter)

    def answer(self) -> bytes:
        """The JSON body of the API's answer: per-item results and the counts."""
        return json.dumps({"results": self.results, "accepted": self.accepted, "rejected": self.rejected}).encode()


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits :func:`judge_body` applies (from the API's settings)."""

    max_items: int
    """Most events in one batch."""
    record_limit: int
    """Largest key plus value the events topic takes."""
    dlq_keep: int
    """Most raw bytes a dead letter keeps."""


@dataclass(slots=True)
class Verdict:
    """:func:`judge_body`'s answer: the judged items, or the whole body's rejection and its dead letter.

    A plain picklable value (not an exception), so that a worker process can hand it back.
    """

    judged: Judgement | None = None
    is_batch: bool = False
    status: int = 200
    """400 or 413 when the whole body was rejected."""
    kind: str = ""
    """Reason class of a whole-body rejection."""
    letter: DeadLetter | None = None
    body: bytes = b""
    """The answer's JSON body when ``judged`` is set (made here, so a worker process does that work too)."""


def judge_body(raw: bytes, tenant: str, limits: Limits) -> Verdict:
    """Decode ``raw`` and judge its items: the whole request's CPU work, in one call without I/O."""
    clean = validate_clean_body(raw, tenant, limits.max_items)
    if clean is not None:
        events, is_batch = clean
        judged = _judge_clean(events, limits.record_limit)
        if judged is not None:
            return Verdict(judged=judged, is_batch=is_batch, body=judged.answer())
    try:
        items, is_batch = decode_body(raw, limits.max_items)
    except BodyTooLarge as exc:
        letter = dead_letter(exc.received, exc.reason, tenant=tenant, keep=limits.dlq_keep, size=exc.size)
        return Verdict(status=413, kind="too_large", letter=letter)
    except InvalidEvent as exc:
        return Verdict(
            status=400, kind="malformed", letter=dead_letter(raw, exc.reason, tenant=tenant, keep=limits.dlq_keep)
        )
    judged = judge_items(items, tenant, record_limit=limits.record_limit, dlq_raw_limit=limits.dlq_keep)
    return Verdict(judged=judged, is_batch=is_batch, body=judged.answer())


def reason_class(error: InvalidEvent) -> str:
    """The metric label of a rejection: a small fixed set, never the free-text reason."""
    if isinstance(error, UnsupportedSchemaVersion):
        return "unsupported_schema_version"
    if isinstance(error, EventTooLarge):
        return "too_large"
    return "invalid"


def decode_body(raw: bytes, max_items: int) -> tuple[list[object], bool]:
    """The body's items and whether it was a batch; raises :class:`InvalidEvent` for a bad body."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start]
        raise InvalidEvent(f"request body is not valid UTF-8: byte 0x{bad:02x} at offset {exc.start}") from exc
    is_batch = text.lstrip(" \t\r\n").startswith("[")
    # A batch's array adds one level around events that may each nest MAX_JSON_DEPTH deep.
    limit = MAX_JSON_DEPTH + 1 if is_batch else MAX_JSON_DEPTH
    if _nested_deeper_than(raw, limit):
        raise InvalidEvent(f"request body is nested deeper than {limit} levels; an event may nest {MAX_JSON_DEPTH}")
    data = load_json(text, _NO_DEPTH_LIMIT)
    if isinstance(data, dict):
        return [data], False
    if not isinstance(data, list):
        raise InvalidEvent(
            f"request body must be one event (a JSON object) or a batch (a JSON array of events), got {json_type(data)}"
        )
    if len(data) > max_items:
        raise BodyTooLarge(
            f"batch has {len(data)} events, over the limit of {max_items} (LIVELOOP_INGEST_MAX_BATCH_ITEMS); "
            "split it into smaller batches",
            raw,
            len(raw),
        )
    return data, True


def judge_items(items: list[object], tenant: str, *, record_limit: int, dlq_raw_limit: int) -> Judgement:
    """Validate, authorise, de-duplicate and redact every item; plan records and dead letters.

    ``record_limit`` is the largest key plus value the events topic takes; ``dlq_raw_limit`` the most
    raw bytes a dead letter keeps.
    """
    judged = Judgement()
    seen: set[UUID] = set()
    for index, item in enumerate(items):
        try:
            event = validate_item(item, tenant)
        except InvalidEvent as exc:
            _reject(judged, index, item, exc.reason, exc.field, reason_class(exc), tenant, dlq_raw_limit)
            continue
        if event.tenant != tenant:
            reason = f"tenant {event.tenant!r} does not match the API key's tenant {tenant!r}"
            _reject(judged, index, item, reason, "tenant", "tenant_mismatch", tenant, dlq_raw_limit)
            continue
        if event.event_id in seen:
            reason = f"duplicate event_id {event.event_id} in this batch; every event needs its own event_id"
            _reject(judged, index, item, reason, "event_id", "duplicate", tenant, dlq_raw_limit)
            continue
        seen.add(event.event_id)
        too_large = _accept(judged, index, event, record_limit)
        if too_large is not None:
            _reject(judged, index, item, too_large, None, "too_large", tenant, dlq_raw_limit)
    return judged


def _judge_clean(events: list[Event], record_limit: int) -> Judgement | None:
    """:func:`judge_items` for events the fast path validated; ``None`` if one is too large once serialised."""
    judged = Judgement()
    for index, event in enumerate(events):
        if _accept(judged, index, event, record_limit) is not None:
            return None  # rare: the exact path rejects it, with the item's own bytes in the dead letter
    return judged


def _accept(judged: Judgement, index: int, event: Event, record_limit: int) -> str | None:
    """Acknowledge a valid event: privacy-mode ones only counted, the rest redacted and serialised.

    Returns the reason when the event is too large for the events topic (nothing is recorded then).
    """
    if event.privacy_mode:
        # Acknowledged so that the product does not retry, but never written anywhere.
        judged.results.append({"index": index, "status": "accepted", "event_id": str(event.event_id), "stored": False})
        judged.accepted += 1
        judged.privacy_dropped += 1
        return None
    redacted, counts = redact_event(event)
    key = event.session_id.encode("utf-8")
    # The model's own serializer writes the same bytes as event_to_json, several times faster.
    value = type(redacted).__pydantic_serializer__.to_json(redacted)
    if len(key) + len(value) > record_limit:
        return (
            f"event is {len(key) + len(value)} bytes once serialised, over the events topic's record limit of "
            f"{record_limit} (LIVELOOP_INGEST_MAX_MESSAGE_BYTES); truncate the prompt, completion or trajectory"
        )
    if counts:
        judged.redactions.update(counts)
    judged.records.append((key, value))
    judged.results.append({"index": index, "status": "accepted", "event_id": str(event.event_id)})
    judged.accepted += 1
    return None


def validate_item(item: object, tenant: str) -> Event:
    """One decoded item as an event, with the key's tenant filled in when the item names none.

    Same verdicts and reasons as :func:`ingest.events.parse_event`, minus its per-event depth scan:
    :func:`decode_body` bounded the depth of the whole body already, and the scan is a large share of
    the per-event cost. Anything off the common path is handed to ``parse_event`` itself.
    """
    if not isinstance(item, dict):
        raise InvalidEvent(f"an event must be a JSON object, got {json_type(item)}")
    if "tenant" not in item:
        item = {**item, "tenant": tenant}
    name = item.get("type")
    version = item.get("schema_version")
    cls = EVENT_CLASSES.get(name) if isinstance(name, str) else None
    if cls is None or (isinstance(version, int) and version > SCHEMA_VERSION):
        return parse_event(item)
    reject_nul(item)
    try:
        return cast("Event", cls.model_validate(item))
    except ValidationError as exc:
        raise invalid_from(exc) from exc


def dead_letter(
    raw: bytes,
    reason: str,
    *,
    tenant: str,
    keep: int,
    size: int | None = None,
    field: str | None = None,
    session_id: str | None = None,
) -> DeadLetter:
    """A dead letter keeping at most ``keep`` bytes of ``raw`` and its true size (a dead letter must fit
    the DLQ topic's records, so the payload is cut; ``raw_size`` still tells the truth). A privacy-mode
    item keeps nothing identifying: :meth:`DeadLetter.of` decides, on the whole of ``raw``."""
    return DeadLetter.of(
        raw, reason, source="ingest-api", field=field, tenant=tenant, session_id=session_id, keep=keep, size=size
    )


def _reject(
    judged: Judgement,
    index: int,
    item: object,
    reason: str,
    field: str | None,
    kind: str,
    tenant: str,
    keep: int,
) -> None:
    judged.rejected += 1
    judged.rejected_by_class[kind] += 1
    letter = dead_letter(_item_bytes(item), reason, tenant=tenant, keep=keep, field=field, session_id=_session_id(item))
    # The caller's answer carries the same reason as the dead letter: a private item's values are masked there too.
    judged.results.append({"index": index, "status": "rejected", "reason": letter.reason, "field": field})
    judged.letters.append(letter)


def _item_bytes(item: object) -> bytes:
    # The item's own bytes are not at hand after decoding the batch; its re-serialisation is equal JSON.
    try:
        return json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a "\ud800" escape: keep it escaped
        return json.dumps(item, separators=(",", ":")).encode("ascii")


def _session_id(item: object) -> str | None:
    """The item's session id if it is usable as a Kafka key, so its dead letter lands by the session."""
    session = item.get("session_id") if isinstance(item, dict) else None
    if not isinstance(session, str) or not 0 < len(session) <= MAX_ID_CHARS:
        return None
    try:
        session.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return session


def _nested_deeper_than(raw: bytes, limit: int) -> bool:
    """Whether JSON ``raw`` nests arrays/objects deeper than ``limit`` (brackets inside strings do not count).

    Every step is one C-level pass over the bytes (a regex over the full text costs more than parsing
    it). UTF-8 never puts an ASCII byte inside a multi-byte character, so working on bytes is exact.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    # Escaped backslashes first, then escaped quotes: what is left of '"' delimits strings.
    structure = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _STRUCTURE)
    brackets = b"".join(structure.split(b'"')[::2])  # every other piece between quotes is outside strings
    for _ in range(limit):
        if not brackets:
            return False
        brackets, peeled = _EMPTY_PAIR.subn(b"", brackets)
        if not peeled:
            # Unbalanced: the JSON is malformed and its parser will say so, unless so many brackets stay
            # open that parsing it could exhaust the stack.
            return len(brackets) > limit
    return bool(brackets)
