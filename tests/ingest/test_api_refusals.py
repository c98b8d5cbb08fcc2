"""The HTTP ingest API's refusals: every bad event, body or size gets a reason and exactly one dead letter.

Every test runs its own app on fresh topics (fixtures in ``tests/ingest/conftest.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from starlette.types import ASGIApp, Message, Scope

from ingest.dead_letters import PARTIAL
from ingest.errors import InvalidEvent
from ingest.events import MAX_JSON_DEPTH, parse_event
from tests.ingest.api_harness import Api, event

# ------------------------------------------------------------------------------------- rejected events


def test_a_mixed_batch_gets_results_per_item_in_order(api: Api) -> None:
    good, missing, also_good, unknown = event(), event(), event("session.started"), event()
    del missing["user_id"]
    unknown["type"] = "suggestion.exploded"
    batch = [good, missing, also_good, unknown, 42]

    response = api.post(batch)

    assert response.status_code == 200
    body = response.json()
    assert (body["accepted"], body["rejected"]) == (2, 3)
    results = body["results"]
    assert [r["index"] for r in results] == [0, 1, 2, 3, 4]
    assert [r["status"] for r in results] == ["accepted", "rejected", "accepted", "rejected", "rejected"]
    assert results[1] == {
        "index": 1,
        "status": "rejected",
        "reason": "field 'user_id': required field is missing",
        "field": "user_id",
    }
    assert results[3]["field"] == "type"
    assert "unknown event type 'suggestion.exploded'" in results[3]["reason"]
    assert results[4]["reason"] == "an event must be a JSON object, got a number"
    assert sorted(json.loads(r.value)["event_id"] for r in api.events()) == sorted(
        [good["event_id"], also_good["event_id"]]
    )
    letters = api.letters()
    assert [letter.reason for letter in letters] == [results[i]["reason"] for i in (1, 3, 4)]
    assert all(letter.source == "ingest-api" and letter.tenant == "default" for letter in letters)
    assert json.loads(letters[0].raw()) == missing
    assert letters[0].session_id == "sess-1"
    assert api.metric("liveloop_ingest_events_rejected_total", reason="invalid") == 3


def _missing(item: dict[str, Any]) -> dict[str, Any]:
    del item["payload"]["generation_id"]
    return item


BAD_EVENTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "unknown type": lambda item: item | {"type": "mouse.moved"},
    "newer schema_version": lambda item: item | {"schema_version": 99},
    "missing field": _missing,
    "extra field": lambda item: item | {"colour": "blue"},
    "wrong type": lambda item: item | {"privacy_mode": "no"},
    "naive timestamp": lambda item: item | {"ts": "2025-01-31T12:00:00"},
    "bad uuid": lambda item: item | {"event_id": "not-a-uuid"},
}


@pytest.mark.parametrize("case", BAD_EVENTS)
@pytest.mark.parametrize("shape", ["single", "batch"])
def test_every_bad_event_is_rejected_with_the_contracts_reason_and_dead_lettered_once(
    api: Api, case: str, shape: str
) -> None:
    item = BAD_EVENTS[case](event())
    with pytest.raises(InvalidEvent) as contract:
        parse_event(item | {"tenant": "default"})

    response = api.post(item if shape == "single" else [event(), item])

    assert response.status_code == (422 if shape == "single" else 200)
    rejected = response.json()["results"][-1]
    assert rejected["status"] == "rejected"
    assert rejected["reason"] == contract.value.reason
    assert rejected["reason"]
    assert rejected["field"] == contract.value.field
    (letter,) = api.letters()
    assert (letter.reason, letter.field, letter.session_id) == (rejected["reason"], rejected["field"], "sess-1")
    assert json.loads(letter.raw()) == item
    assert len(api.events()) == (0 if shape == "single" else 1)


BAD_BODIES = {
    "malformed JSON": (b'{"type": "rating", ', "malformed JSON"),
    "invalid UTF-8": (b'{"type": "rating", "user_id": "\xff\xfe"}', "not valid UTF-8: byte 0xff at offset 31"),
    "deeply nested": (b"[" * 200 + b"]" * 200, f"nested deeper than {MAX_JSON_DEPTH + 1} levels"),
    "deeply nested event": (
        json.dumps(
            event() | {"payload": {"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}
        ).encode(),
        f"nested deeper than {MAX_JSON_DEPTH} levels",
    ),
    "unbalanced brackets": (b"[" * 5000, "nested deeper than"),
    "a string": (b'"hello"', "got a string"),
    "a number": (b"12", "got a number"),
    "empty": (b"", "malformed JSON"),
    "NaN": (b'{"latency": NaN}', "NaN is not a valid JSON number"),
    "duplicate key": (b'{"type": "rating", "type": "followup"}', "appears twice"),
}


@pytest.mark.parametrize("case", BAD_BODIES)
def test_every_bad_body_gets_400_with_a_reason_and_one_dead_letter(api: Api, case: str) -> None:
    raw, expected = BAD_BODIES[case]
    response = api.post(None, raw=raw)
    assert response.status_code == 400
    reason = response.json()["detail"]
    assert expected in reason
    (letter,) = api.letters()
    assert letter.reason == reason
    assert letter.tenant == "default"
    assert letter.raw() == raw
    assert letter.raw_size == len(raw)
    assert api.events() == []
    assert api.metric("liveloop_ingest_events_rejected_total", reason="malformed") == 1


def test_a_duplicate_event_id_in_one_batch_is_rejected_the_second_time(api: Api) -> None:
    first = event()
    second = event("rating") | {"event_id": first["event_id"].upper()}  # the same UUID, written differently
    response = api.post([first, event(), second])
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["accepted", "accepted", "rejected"]
    assert results[2]["reason"].startswith(f"duplicate event_id {first['event_id']} in this batch")
    assert results[2]["field"] == "event_id"
    (letter,) = api.letters()
    assert letter.reason == results[2]["reason"]
    assert len(api.events()) == 2


def test_a_body_over_the_size_limit_gets_413_unread_and_one_dead_letter(start_api: Callable[..., Api]) -> None:
    api = start_api(max_request_bytes=64 * 1024)
    huge = [event("generation") | {"payload": event("generation")["payload"] | {"prompt": "x" * 70_000}}]
    response = api.post(huge)
    assert response.status_code == 413
    assert "over the limit of 65536 (LIVELOOP_INGEST_MAX_REQUEST_BYTES)" in response.json()["detail"]
    (letter,) = api.letters()
    assert letter.reason == response.json()["detail"]
    assert letter.raw_size == len(json.dumps(huge))  # the declared size; nothing of it was read
    assert api.events() == []
    assert api.metric("liveloop_ingest_events_rejected_total", reason="too_large") == 1


def test_a_streamed_body_over_the_limit_is_cut_off_while_reading(start_api: Callable[..., Api]) -> None:
    api = start_api(max_request_bytes=64 * 1024)
    chunk = b" " * 16 * 1024
    portal = api.client.portal  # the event loop the app (and its Kafka producer) runs in
    assert portal is not None
    status, reads = portal.call(_post_chunked, api.client.app, api.keys["default"], chunk, 100)
    assert status == 413
    assert reads <= 6  # stopped after the limit, not after all 100 chunks
    (letter,) = api.letters()
    assert "exceeds the limit of 65536 bytes" in letter.reason
    # Nothing of what was read is kept: a privacy_mode further on could not be ruled out.
    assert (letter.raw(), letter.session_id, letter.raw_size) == (b"", None, 5 * len(chunk))
    assert letter.reason.endswith(PARTIAL)


async def _post_chunked(app: ASGIApp, key: str, chunk: bytes, count: int) -> tuple[int, int]:
    """Send a body without Content-Length, ``count`` chunks, straight through ASGI; (status, chunks read)."""
    reads = 0
    status = 0

    async def receive() -> Message:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": chunk, "more_body": reads < count}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/events",
        "raw_path": b"/v1/events",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {key}".encode()), (b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    return status, reads


def test_a_batch_over_the_item_limit_gets_413_and_one_dead_letter(start_api: Callable[..., Api]) -> None:
    api = start_api(max_batch_items=5)
    response = api.post([event() for _ in range(6)])
    assert response.status_code == 413
    assert "batch has 6 events, over the limit of 5" in response.json()["detail"]
    assert len(api.letters()) == 1
    assert api.events() == []


def test_an_event_over_the_topics_record_limit_is_rejected_not_sent(start_api: Callable[..., Api]) -> None:
    api = start_api(max_message_bytes=64 * 1024)
    big = event("generation")
    big["payload"]["prompt"] = "word " * 20_000
    response = api.post([big, event()])
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["rejected", "accepted"]
    assert "over the events topic's record limit" in results[0]["reason"]
    (letter,) = api.letters()
    assert letter.raw_size > 100_000
    assert len(letter.raw()) <= 32 * 1024
    assert len(api.events()) == 1
