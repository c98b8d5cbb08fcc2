"""Fuzzing the HTTP ingest API (issue #8): at least ``reliability.fuzz_requests`` hostile requests, no 5xx.

The app runs under uvicorn on a real socket, against the session's real Kafka broker, with small limits
(256 KiB bodies, 64 KiB records, 50 events a batch) so that bodies around every limit are cheap to send.
Requests come from schemathesis (the app's OpenAPI document, positive and negative, with the tenant's key,
and some with no key or a wrong one) and from hypothesis (arbitrary JSON, deep nesting, huge numbers,
invalid UTF-8, truncated JSON, wrong content types, chunked bodies, mutated events, mixed batches, bodies
at the size limits). Every answer must be below 500 and every rejection must carry a reason; afterwards
the DLQ topic must hold exactly one dead letter per rejection, with the same reason, the events topic
exactly the events reported stored, and the API must still be healthy and still accept a valid event.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import strategies as st
from schemathesis import GenerationMode

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.api import create_app
from ingest.dead_letters import DeadLetter
from ingest.settings import IngestSettings
from tests.conftest import free_port
from tests.ingest.api_harness import event
from tests.reliability.fuzzing import (
    SchemaFuzz,
    Tally,
    drive,
    dumps,
    hostile_json,
    post,
    split,
    wire_forms,
)
from tests.reliability.profile import ReliabilityProfile
from tests.serving.gateway_server import serve_in_thread
from tests.topic_reader import read_topic

SHARES = {"positive": 0.3, "negative": 0.3, "unauthenticated": 0.05, "probes": 0.01, "hypothesis": 0.34}


@dataclass
class Expected:
    """What the answers say must now be on the topics: stored events and one dead letter per rejection."""

    stored: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def check(self, status: int, content: bytes, headers: Mapping[str, str]) -> str | None:
        """The answer is sound (a reason for every rejection); note what it implies for the topics."""
        if status == 200 and content.startswith(b"# HELP"):
            return None  # GET /metrics
        try:
            body = json.loads(content)
        except ValueError:
            return f"answer {status} is not JSON"
        if status in (400, 401, 413):
            detail = body.get("detail") if isinstance(body, dict) else None
            if not isinstance(detail, str) or not detail.strip():
                return f"{status} without a 'detail' reason"
            if status != 401:  # a 401 is answered before anything is read, so nothing is dead-lettered
                self.reasons[detail] += 1
            return None
        if status in (200, 422) and isinstance(body, dict) and isinstance(body.get("results"), list):
            return self._results(status, body)
        if status in (200, 422):
            return None if status == 200 and body in ({"status": "ok"}, {"ready": True}) else f"bad {status} body"
        return f"unexpected status {status}"

    def _results(self, status: int, body: dict[str, Any]) -> str | None:
        results = body["results"]
        rejected = [r for r in results if r.get("status") == "rejected"]
        accepted = [r for r in results if r.get("status") == "accepted"]
        if len(rejected) + len(accepted) != len(results) or (body["accepted"], body["rejected"]) != (
            len(accepted),
            len(rejected),
        ):
            return "counts do not match the results"
        if status == 422 and (len(results), len(rejected)) != (1, 1):
            return "a 422 must reject the single event sent"
        for result in rejected:
            if not isinstance(result.get("reason"), str) or not result["reason"].strip():
                return f"rejected item {result.get('index')} has no reason"
            self.reasons[result["reason"]] += 1
        self.stored += sum(1 for r in accepted if r.get("stored", True))
        return None


@dataclass
class Target:
    url: str
    key: str
    settings: IngestSettings


@pytest.fixture
def target(endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path) -> Iterator[Target]:
    """The ingest API under uvicorn on fresh topics, with small limits and one tenant's key."""
    credentials = tmp_path / "credentials.json"
    key = ensure_credentials(credentials).ingest_keys["default"].get_secret_value()
    settings = IngestSettings(
        port=free_port(),
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=make_topic(partitions=1, prefix="fuzz"),
        dlq_topic=make_topic(partitions=1, prefix="fuzz-dlq"),
        credentials_path=credentials,
        max_request_bytes=256 << 10,
        max_message_bytes=64 << 10,
        max_batch_items=50,
        linger_ms=0,
    )
    with serve_in_thread(create_app(settings), settings.port) as url:
        yield Target(url, key, settings)


def test_fuzzed_requests_never_get_a_server_error_and_every_rejection_is_dead_lettered(
    target: Target, reliability: ReliabilityProfile
) -> None:
    expected = Expected()
    tally = Tally(expected.check)
    counts = split(reliability.fuzz_requests, SHARES)
    events = [("/v1/events", "POST")]
    with requests.Session() as session:
        fuzz = SchemaFuzz(target.url, session, tally, target.key)
        fuzz.run(events, GenerationMode.POSITIVE, counts["positive"], "schemathesis positive")
        fuzz.run(events, GenerationMode.NEGATIVE, counts["negative"], "schemathesis negative")
        fuzz.run_unauthenticated(events, counts["unauthenticated"])
        probes = [("/healthz", "GET"), ("/readyz", "GET"), ("/metrics", "GET")]
        fuzz.run(probes, GenerationMode.POSITIVE, counts["probes"], "schemathesis positive")

        limits = target.settings
        headers = {"Authorization": f"Bearer {target.key}"}

        def send(request: Any) -> None:
            generator = f"hypothesis {request.kind.split('+')[0]}"
            try:
                response = post(session, f"{target.url}/v1/events", request, headers)
            except requests.RequestException as exc:
                tally.failed(generator, request.describe(), exc)
                return
            tally.record(
                generator, response.status_code, response.content, response.request.headers, request.describe()
            )

        hostile = hostile_ingest_requests(limits.max_request_bytes, limits.max_message_bytes, limits.max_batch_items)
        drive(hostile, counts["hypothesis"], send)

        # Still serving: healthy, ready, and a valid event is accepted and lands on the topic.
        assert session.get(f"{target.url}/healthz", timeout=30).json() == {"status": "ok"}
        assert session.get(f"{target.url}/readyz", timeout=30).json() == {"ready": True}
        final = valid_event()
        answer = session.post(f"{target.url}/v1/events", json=final, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"] == [{"index": 0, "status": "accepted", "event_id": final["event_id"]}]

    letters = [DeadLetter.model_validate_json(r.value) for r in read_topic(limits.bootstrap, limits.dlq_topic)]
    stored = read_topic(limits.bootstrap, limits.events_topic)
    dead_lettered = Counter(letter.reason for letter in letters)  # an answer quotes its dead letter's reason exactly
    missing = expected.reasons - dead_lettered
    unexpected = dead_lettered - expected.reasons
    tally.write(
        reliability,
        "fuzz-ingest",
        {
            "dead_letters": len(letters),
            "rejections_answered": sum(expected.reasons.values()),
            "events_stored": len(stored),
            "events_reported_stored": expected.stored + 1,
        },
    )
    assert tally.total >= reliability.fuzz_requests
    assert tally.server_errors == 0, tally.problems
    assert tally.problem_count == 0, tally.problems
    assert not missing, f"rejections without a dead letter: {list(missing.items())[:5]}"
    assert not unexpected, f"dead letters without a rejection: {list(unexpected.items())[:5]}"
    assert all(letter.tenant == "default" and letter.source == "ingest-api" for letter in letters)
    assert len(stored) == expected.stored + 1
    assert json.loads(stored[-1].value)["event_id"] == final["event_id"]


# ----------------------------------------------------------------------------------------- the bodies


GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"  # built by concatenation: no scanner sees a real token
_IDS = st.text(st.characters(exclude_categories=["Cc", "Cs"]), min_size=1, max_size=40)
_TEXT = st.text(max_size=200) | st.sampled_from([f"token = {GITHUB_TOKEN}\n", "\x00\u2028\ufeff", ""])
_NAMES = st.sampled_from(["tiny", "acme-vscode", "pytest", "ünïcode ✓"])


def valid_event(kind: str = "rating") -> dict[str, Any]:
    """A valid event of ``kind`` (rating or generation) with a fresh event_id and generation_id."""
    data = event(kind)
    return data | {"payload": data["payload"] | {"generation_id": str(uuid.uuid4())}}


@st.composite
def valid_events(draw: st.DrawFn) -> dict[str, Any]:
    """Valid events of several types, their free text drawn (secrets and odd characters included)."""
    feedback = {"generation_id": str(draw(st.uuids()))}
    tokens = draw(st.lists(st.integers(0, 2**31 - 1), max_size=8))
    payloads: dict[str, dict[str, Any]] = {
        "generation": {
            **feedback,
            "model": draw(_NAMES),
            "policy_version": draw(st.integers(0, 2**40)),
            "prompt": draw(_TEXT),
            "completion": draw(_TEXT),
            "completion_token_ids": tokens,
            "completion_logprobs": [-draw(st.floats(0, 100)) for _ in tokens],
            "tool_calls": [{"name": draw(_NAMES), "arguments": draw(_TEXT)}],
            "surface": "ide.tab",
        },
        "rating": {**feedback, "thumbs": draw(st.sampled_from(["up", "down"]))},
        "suggestion.accepted": feedback,
        "session.started": {"surface": "agent", "client": draw(_NAMES)},
        "tool.result": {**feedback, "tool": draw(_NAMES), "valid": draw(st.booleans()), "error": draw(_TEXT)},
        "tests.result": {**feedback, "passed": draw(st.integers(0, 2**31 - 1)), "failed": 0},
        "edit.persisted": {**feedback, "fraction_remaining": draw(st.floats(0, 1)), "seconds_after": 30.0},
        "session.ended": {"reason": draw(_TEXT)},
    }
    kind = draw(st.sampled_from(sorted(payloads)))
    return {
        "event_id": str(draw(st.uuids())),
        "type": kind,
        "ts": draw(st.sampled_from(["2025-01-31T12:00:00Z", "2025-01-31T14:00:00.123+02:00", "1970-01-01T00:00:00Z"])),
        "session_id": draw(_IDS),
        "user_id": draw(_IDS),
        "privacy_mode": draw(st.sampled_from([False, False, True])),
        "payload": payloads[kind],
    }


_EDGES: dict[str, list[Any]] = {
    "ts": [
        "2025-01-31T12:00:00",
        1738324800,
        "9999-12-31T23:59:59-23:59",
        "0001-01-01T00:00:00+23:59",
        "2025-02-30T00:00:00Z",
        "2025-01-31T12:00:00.9999999999Z",
    ],
    "schema_version": [0, 2, 10**30, -1, "1", 1.0, True],
    "event_id": ["", "not-a-uuid", str(uuid.uuid4()).upper(), f"urn:uuid:{uuid.uuid4()}", 7],
    "tenant": ["acme", "DEFAULT", "", "a" * 64, "default\x00"],
    "session_id": ["", "a" * 129, "a" * 128, "\x00", "\u2028", "a\nb", "\ud800"],
    "privacy_mode": ["true", 1, None],
    "type": ["generation ", "GENERATION", "", "rating\x00", "x" * 10_000],
}


@st.composite
def mutated_events(draw: st.DrawFn) -> bytes:
    """A valid event with one field dropped, retyped, renamed, set to an edge value or given twice."""
    event = draw(valid_events())
    how = draw(st.sampled_from(["drop", "retype", "rename", "edge", "edge", "duplicate"]))
    target = event if draw(st.booleans()) or how == "edge" else event["payload"]
    name = draw(st.sampled_from(sorted(_EDGES) if how == "edge" else sorted(target)))
    if how == "drop":
        del target[name]
    elif how == "retype":
        target[name] = draw(hostile_json(5))
    elif how == "rename":
        target[name + draw(st.sampled_from(["_", "X", " ", "\x00"]))] = target.pop(name)
    elif how == "edge":
        event[name] = draw(st.sampled_from(_EDGES[name]))
    raw = dumps(event, ascii_only=draw(st.booleans()))
    if how == "duplicate":
        # The same key twice in one object: parsers disagree on which wins, so it must be rejected.
        raw = raw.replace(b"{", b"{" + dumps(name) + b": " + dumps(draw(hostile_json(2))) + b", ", 1)
    return raw


def _batch(items: list[bytes], repeat_first: bool) -> bytes:
    if repeat_first and items:
        items = [items[0], *items]  # the same event_id twice in one batch
    return b"[" + b",".join(items) + b"]"


def _at_size(size: int, template: dict[str, Any], text_field: str) -> bytes:
    """``template`` with its ``text_field`` padded so that the body is ``size`` bytes (or just over)."""
    event = json.loads(json.dumps(template))
    event["payload"][text_field] = ""
    body = dumps(event)
    event["payload"][text_field] = "x" * max(0, size - len(body))
    return dumps(event)


_RAW = [
    b"",
    b"   ",
    b"\xef\xbb\xbf{}",
    b"{}",
    b"[]",
    b"[[]]",
    b"null",
    b'"event"',
    b"NaN",
    b"[" * 100_000,
    b"[" * 33 + b"]" * 33,
    b'{"a":' * 40 + b"1" + b"}" * 40,
    b"9" * 5000,
    b"[1e999999]",
    b'{"type": "rating", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"\\ud800": 1}',
    b'{"type": "rating\\u0000"}',
]


def hostile_ingest_requests(max_body: int, max_record: int, max_items: int) -> st.SearchStrategy[Any]:
    """Hostile requests for ``POST /v1/events`` (see the module docstring), sized around the API's limits."""
    # Mostly valid items, so that many batches get past the body's checks to the per-item verdicts.
    valid = valid_events().map(dumps)
    items = st.one_of(valid, valid, valid, mutated_events(), hostile_json(8).map(dumps))
    batches = st.builds(_batch, st.lists(items, max_size=8), st.booleans())
    oversized = st.builds(
        lambda n: _batch([dumps(valid_event()) for _ in range(n)], False),
        st.sampled_from([max_items, max_items + 1]),
    )
    sizes = st.integers(-64, 64)
    at_limits = st.one_of(
        st.builds(lambda d: _at_size(max_record - 4096 + d, valid_event("generation"), "prompt"), sizes),
        st.builds(lambda d: _at_size(max_body + d, valid_event("generation"), "completion"), sizes),
        st.builds(lambda d: dumps(valid_event()).ljust(max_body + d, b" "), sizes),
        oversized,
    )
    return st.one_of(
        wire_forms("json", hostile_json().map(dumps)),
        wire_forms("json", st.builds(dumps, hostile_json(), st.booleans())),
        wire_forms("raw", st.sampled_from(_RAW)),
        wire_forms("mutated", mutated_events()),
        wire_forms("batch", batches),
        wire_forms("limits", at_limits),
    )
