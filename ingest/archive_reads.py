"""Streamed reads of the archived events (``events``), for replay, audit and export.

Every read goes through a server-side (named) cursor fetching ``batch_rows`` rows at a time, so memory
stays bounded however long the range: a month of events is never loaded at once. A time range is
half-open, ``start <= ts < end``, on the event's own time.

A session is the unit of replay: a session with any event in the range is read whole (its events before
and after the range included), in arrival order (Kafka partition, then offset). Sessions are ordered by
``session_id COLLATE "C"``, byte order, which is Python's order of ``str`` too, so that a caller can
merge this stream with another one ordered the same way (the stored samples) without loading either.

Privacy: the archiver never stores a privacy-mode event. These reads still leave out every session with a
privacy-mode event (and the export every such event's session), so that rows written by an older or a
foreign archiver cannot leak through an audit.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator
from datetime import datetime
from typing import Any

import psycopg

from ingest.events import EVENT_ADAPTER, MAX_EVENT_BYTES, Event, parse_event

BATCH_ROWS = 2_000
"""Rows a server-side cursor fetches per round trip: large enough to amortise it, small enough to stay bounded."""

PRIVATE_SESSIONS = "SELECT session_id FROM events WHERE (body->>'privacy_mode')::boolean IS TRUE"
"""The sessions with a privacy-mode event (SQL): left out of every read here."""

# Whole literal queries, one per variant: no query text is ever built at run time; values are parameters.
SESSIONS_IN_RANGE = f"""
    SELECT DISTINCT session_id FROM events WHERE ts >= %(start)s AND ts < %(end)s
    EXCEPT {PRIVATE_SESSIONS}
"""
"""The sessions (SQL, parameters ``start`` and ``end``) with an event in the range, privacy-mode ones left out."""
_EVENTS = f"""
    SELECT session_id, body::text FROM events WHERE session_id IN ({SESSIONS_IN_RANGE})
    ORDER BY session_id COLLATE "C", kafka_partition, kafka_offset
"""
_EVENTS_OF = f"""
    SELECT session_id, body::text FROM events
    WHERE session_id IN ({SESSIONS_IN_RANGE}) AND session_id = ANY(%(sessions)s)
    ORDER BY session_id COLLATE "C", kafka_partition, kafka_offset
"""
EXPORT_COLUMNS = (
    *("event_id", "schema_version", "type", "ts", "session_id", "user_id", "tenant"),
    *("generation_id", "policy_version", "kafka_partition", "kafka_offset", "archived_at", "body"),
)
"""The columns :func:`event_rows` yields, in order (``body`` as JSON text)."""
_EXPORT = f"""
    SELECT event_id::text, schema_version, type, ts, session_id, user_id, tenant, generation_id::text, policy_version,
           kafka_partition, kafka_offset, archived_at, body::text
    FROM events WHERE ts >= %(start)s AND ts < %(end)s AND session_id NOT IN ({PRIVATE_SESSIONS})
    ORDER BY ts, event_id
"""
_COUNT_SESSION_EVENTS = f"SELECT count(*) FROM events WHERE session_id IN ({SESSIONS_IN_RANGE})"
_COUNT = f"""
    SELECT count(*) FROM events WHERE ts >= %(start)s AND ts < %(end)s AND session_id NOT IN ({PRIVATE_SESSIONS})
"""


def session_bodies(
    conn: psycopg.Connection[Any],
    start: datetime,
    end: datetime,
    session_ids: Collection[str] | None = None,
    *,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[tuple[str, list[str]]]:
    """(session id, its events' JSON texts in arrival order) for every session with an event in ``[start, end)``
    (only ``session_ids`` among them, when given), sessions in byte order of their ids, one at a time. The
    texts are left for the caller to read with :func:`archived_event`: replay parses them in its workers.

    Runs inside a transaction of ``conn`` (a named cursor needs one); the caller's connection stays usable.
    """
    params = {"start": start, "end": end, "sessions": list(session_ids or ())}
    with conn.cursor(name="archive_session_events") as cursor:
        cursor.itersize = batch_rows
        cursor.execute(_EVENTS if session_ids is None else _EVENTS_OF, params)
        for session_id, rows in itertools.groupby(cursor, key=lambda row: row[0]):
            yield session_id, [body for _, body in rows]


def archived_event(body: str | bytes) -> Event:
    """One archived event from ``events.body``: the event :func:`ingest.events.parse_event` reads from it.

    Validated by pydantic straight from the JSON text, several times faster than parse_event, which decodes
    it into dicts first (replay reads every event of a range). What parse_event checks beyond the models
    cannot occur in this text: ``jsonb`` holds no duplicate key, no ``\\u0000`` and no NaN, and no event
    of the contract nests anywhere near ``MAX_JSON_DEPTH`` (no field takes free-form JSON). Anything this
    path refuses, or that is over the size limit, gets parse_event's own verdict and reason.
    """
    if len(body) <= MAX_EVENT_BYTES:
        try:
            return EVENT_ADAPTER.validate_json(body)
        except ValueError:  # pydantic's ValidationError is one
            pass
    return parse_event(body)


def event_rows(
    conn: psycopg.Connection[Any], start: datetime, end: datetime, *, batch_rows: int = BATCH_ROWS
) -> Iterator[list[tuple[Any, ...]]]:
    """The archived events with ``start <= ts < end``, as rows of :data:`EXPORT_COLUMNS`, in batches of
    ``batch_rows``, ordered by time; privacy-mode sessions left out."""
    with conn.cursor(name="archive_event_rows") as cursor:
        cursor.itersize = batch_rows
        cursor.execute(_EXPORT, {"start": start, "end": end})
        while batch := cursor.fetchmany(batch_rows):
            yield batch


def count_events(conn: psycopg.Connection[Any], start: datetime, end: datetime) -> int:
    """How many events :func:`event_rows` yields for the range (for a progress bar's total)."""
    row = conn.execute(_COUNT, {"start": start, "end": end}).fetchone()
    return int(row[0]) if row else 0


def count_session_events(conn: psycopg.Connection[Any], start: datetime, end: datetime) -> int:
    """How many events :func:`session_bodies` reads for the range, all sessions (for a progress bar's total)."""
    row = conn.execute(_COUNT_SESSION_EVENTS, {"start": start, "end": end}).fetchone()
    return int(row[0]) if row else 0
