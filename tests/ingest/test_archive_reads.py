"""Reading archived events back: the fast reader gives exactly the event parse_event reads from the stored body."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from infra.migrations import migrate
from ingest.archive_reads import archived_event, session_bodies
from ingest.archiver import Batch, prepare, write_batch
from ingest.events import EVENT_TYPES, MAX_EVENT_BYTES, InvalidEvent, event_to_json, parse_event
from tests.ingest.event_samples import reason_of, sample_event


def test_every_archived_event_reads_back_as_parse_event_reads_its_stored_body(fresh_database: str) -> None:
    migrate(fresh_database)
    originals = []
    for index, event_type in enumerate(EVENT_TYPES):
        body = sample_event(event_type) | {"event_id": str(uuid.uuid4())}
        originals.append(parse_event(json.dumps(body).encode()))
        assert originals[-1].type == event_type, index
    batch = Batch()
    for offset, event in enumerate(originals):
        batch.add_event(event, event_to_json(event), partition=0, offset=offset)
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        prepare(conn)
        write_batch(conn, batch)
        # jsonb's own text: keys reordered, spaces after ':' and ',', the very text replay reads
        stored = [row[0] for row in conn.execute("SELECT body::text FROM events ORDER BY kafka_offset")]
    start = datetime(2025, 1, 31, tzinfo=UTC)
    with psycopg.connect(fresh_database) as conn:  # a named cursor needs a transaction
        sessions = [
            (session_id, [archived_event(body) for body in bodies])
            for session_id, bodies in session_bodies(conn, start, start + timedelta(days=1))
        ]
    assert stored != [event_to_json(event).decode() for event in originals]  # the text really differs
    for text, original in zip(stored, originals, strict=True):
        fast = archived_event(text)
        assert type(fast) is type(original)
        assert event_to_json(fast) == event_to_json(parse_event(text)) == event_to_json(original)
    assert [(session_id, [event_to_json(e) for e in events]) for session_id, events in sessions] == [
        ("sess-1", [event_to_json(event) for event in originals])
    ]


@pytest.mark.parametrize(
    "body",
    [
        {**sample_event("rating"), "type": "no.such.type"},
        {**sample_event("rating"), "schema_version": 99},
        {key: value for key, value in sample_event("generation").items() if key != "session_id"},
        {**sample_event("rating"), "payload": {"generation_id": "not-a-uuid", "thumbs": "up"}},
    ],
    ids=["unknown type", "newer schema", "missing field", "bad uuid"],
)
def test_a_body_the_fast_reader_refuses_gets_parse_events_verdict(body: dict[str, object]) -> None:
    text = json.dumps(body, separators=(", ", ": "))
    with pytest.raises(InvalidEvent) as caught:
        archived_event(text)
    expected = reason_of(text)
    assert (type(caught.value), caught.value.reason, caught.value.field) == (
        type(expected),
        expected.reason,
        expected.field,
    )


def test_a_body_over_the_size_limit_is_refused_as_parse_event_refuses_it() -> None:
    body = sample_event("generation")
    body["payload"]["prompt"] = "x" * (MAX_EVENT_BYTES + 1)
    text = json.dumps(body)
    with pytest.raises(InvalidEvent) as caught:
        archived_event(text)
    assert caught.value.reason == reason_of(text).reason
