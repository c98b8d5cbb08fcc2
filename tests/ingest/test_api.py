"""The HTTP ingest API, against the real broker: what is accepted lands on the events topic (redacted,
keyed by session), what is rejected is answered with a reason and dead-lettered exactly once.

Every test runs its own app (``TestClient`` as a context manager runs the lifespan, which connects the
aiokafka producer) on fresh topics, with a fresh credential file holding two tenants' keys.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer
from kafka.consumer.fetcher import ConsumerRecord
from pydantic import SecretStr, ValidationError
from starlette.types import ASGIApp, Message, Scope

from infra.credentials import ensure_credentials
from infra.processes import wait_until
from infra.stack import Endpoints, Stack
from ingest.api import IngestSettings, create_app
from ingest.dead_letters import DeadLetter
from ingest.errors import InvalidEvent
from ingest.events import MAX_JSON_DEPTH, event_to_json, parse_event
from ingest.redaction import redact_event
from tests.topic_reader import read_topic

GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"  # built by concatenation: no scanner sees a real token
AWS_KEY_ID = "AKIA" + "QZ7TWV3XKP2M9RJD"
OTHER_TENANT = "acme"
GENERATION_ID = "0b7e6f7e-2f4a-4c1e-9d51-5b1f3c1e8a01"


# ---------------------------------------------------------------------------------------------- helpers


def event(kind: str = "suggestion.accepted", session: str = "sess-1", **envelope: Any) -> dict[str, Any]:
    """A valid event of ``kind`` as decoded JSON, with a fresh event_id."""
    payloads: dict[str, dict[str, Any]] = {
        "suggestion.accepted": {"generation_id": GENERATION_ID},
        "rating": {"generation_id": GENERATION_ID, "thumbs": "up"},
        "session.started": {"surface": "ide.tab", "client": "acme-vscode"},
        "generation": {
            "generation_id": GENERATION_ID,
            "model": "tiny",
            "policy_version": 3,
            "prompt": "def add(a, b):\n",
            "completion": "    return a + b\n",
            "completion_token_ids": [4, 5],
            "completion_logprobs": [-0.25, -1.5],
            "surface": "ide.tab",
        },
    }
    data: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "type": kind,
        "ts": "2025-01-31T12:00:00Z",
        "session_id": session,
        "user_id": "user-1",
        "payload": payloads[kind],
    }
    return data | envelope


def dead_letters(bootstrap: str, topic: str) -> list[DeadLetter]:
    return [DeadLetter.model_validate_json(record.value) for record in read_topic(bootstrap, topic)]


class Api:
    """One running app, its topics and keys."""

    def __init__(self, client: TestClient, settings: IngestSettings, keys: dict[str, str]) -> None:
        self.client = client
        self.settings = settings
        self.keys = keys

    def post(self, body: object, tenant: str = "default", raw: bytes | None = None) -> Any:
        content = raw if raw is not None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.keys[tenant]}", "Content-Type": "application/json"}
        return self.client.post("/v1/events", content=content, headers=headers)

    def events(self) -> list[ConsumerRecord]:
        return read_topic(self.settings.bootstrap, self.settings.events_topic)

    def letters(self) -> list[DeadLetter]:
        return dead_letters(self.settings.bootstrap, self.settings.dlq_topic)

    def metric(self, name: str, **labels: str) -> float:
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest.fixture
def credentials_file(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A credential file (mode 0600) with the default tenant's key and a second tenant's."""
    path = tmp_path / "credentials.json"
    creds = ensure_credentials(path)
    other = SecretStr("llik_" + secrets.token_urlsafe(32))
    creds = creds.model_copy(update={"ingest_keys": {**creds.ingest_keys, OTHER_TENANT: other}})
    path.write_text(creds.to_json(), encoding="utf-8")  # the file keeps its 0600 mode
    return path, {tenant: key.get_secret_value() for tenant, key in creds.ingest_keys.items()}


@pytest.fixture
def start_api(
    endpoints: Endpoints, make_topic: Callable[..., str], credentials_file: tuple[Path, dict[str, str]]
) -> Iterator[Callable[..., Api]]:
    """``start_api(**settings)``: an app on fresh topics (3-partition events topic), running until the test ends."""
    path, keys = credentials_file
    stack = contextlib.ExitStack()

    def start(**overrides: Any) -> Api:
        values: dict[str, Any] = {
            "bootstrap": endpoints.kafka_bootstrap,
            "events_topic": make_topic(partitions=3),
            "dlq_topic": make_topic(partitions=1),
            "credentials_path": path,
        }
        settings_ = IngestSettings(**(values | overrides))
        client = stack.enter_context(TestClient(create_app(settings_)))
        return Api(client, settings_, keys)

    with stack:
        yield start


@pytest.fixture
def api(start_api: Callable[..., Api]) -> Api:
    return start_api()


# ------------------------------------------------------------------------------------- accepted events


def test_accepted_events_land_on_the_topic_redacted_and_keyed_by_session(api: Api) -> None:
    sessions = [f"sess-{i}" for i in range(8)]
    batch = [event("generation", session) for _ in range(3) for session in sessions]
    batch[0]["payload"]["prompt"] = f"token = {GITHUB_TOKEN}\naws = {AWS_KEY_ID}\n"
    batch[5]["payload"]["completion"] = f"export GITHUB_TOKEN={GITHUB_TOKEN}\n"

    response = api.post(batch)

    assert response.status_code == 200
    body = response.json()
    assert body["accepted"] == len(batch)
    assert body["rejected"] == 0
    assert body["results"] == [
        {"index": i, "status": "accepted", "event_id": item["event_id"]} for i, item in enumerate(batch)
    ]
    records = api.events()
    assert len(records) == len(batch)
    # The redacted event, exactly as the contract serialises it, with the key's tenant filled in.
    expected = {
        item["event_id"]: event_to_json(redact_event(parse_event(item | {"tenant": "default"}))[0]) for item in batch
    }
    for record in records:
        value = json.loads(record.value)
        assert record.value == expected[value["event_id"]]
        assert record.key == value["session_id"].encode()
        assert GITHUB_TOKEN not in record.value.decode()
        assert AWS_KEY_ID not in record.value.decode()
    # Per session: one partition, in the order sent.
    for session in sessions:
        mine = [r for r in records if r.key == session.encode()]
        assert len({r.partition for r in mine}) == 1
        assert [json.loads(r.value)["event_id"] for r in sorted(mine, key=lambda r: r.offset)] == [
            item["event_id"] for item in batch if item["session_id"] == session
        ]
    assert sum(r.value.count(b"[REDACTED:github_token]") for r in records) == 2
    assert api.metric("liveloop_ingest_redactions_total", kind="github_token") == 2
    assert api.metric("liveloop_ingest_events_accepted_total") == len(batch)
    assert api.letters() == []


def test_partitions_match_the_sdk_producers_default_partitioner(
    api: Api, endpoints: Endpoints, make_topic: Callable[..., str]
) -> None:
    sessions = [f"session-{i}-{uuid.uuid4().hex[:6]}" for i in range(24)]
    assert api.post([event(session=s) for s in sessions]).status_code == 200
    placed = {record.key: record.partition for record in api.events()}
    # kafka-python's producer (the SDK's) on a topic with as many partitions picks the same ones.
    probe = make_topic(partitions=3)
    producer = KafkaProducer(bootstrap_servers=endpoints.kafka_bootstrap)
    try:
        sdk = {s.encode(): producer.send(probe, key=s.encode(), value=b"x").get(timeout=30).partition for s in sessions}
    finally:
        producer.close()
    assert placed == sdk
    assert len(set(placed.values())) > 1


def test_a_single_event_is_accepted_and_its_tenant_comes_from_the_key(api: Api) -> None:
    item = event("rating")
    response = api.post(item, tenant=OTHER_TENANT)
    assert response.status_code == 200
    assert response.json() == {
        "results": [{"index": 0, "status": "accepted", "event_id": item["event_id"]}],
        "accepted": 1,
        "rejected": 0,
    }
    (record,) = api.events()
    assert json.loads(record.value)["tenant"] == OTHER_TENANT


def test_concurrent_requests_are_all_delivered_once_and_sessions_stay_in_order(api: Api) -> None:
    threads, requests_each, batch_size = 6, 8, 40
    sent: dict[str, list[str]] = {}
    failures: list[str] = []

    def client(worker: int) -> None:
        for _n in range(requests_each):
            batch = [event(session=f"w{worker}-s{i % 5}") for i in range(batch_size)]
            response = api.post(batch)
            if response.status_code != 200 or response.json()["accepted"] != batch_size:
                failures.append(response.text)
            for item in batch:
                sent.setdefault(item["session_id"], []).append(item["event_id"])

    workers = [threading.Thread(target=client, args=(w,)) for w in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert failures == []
    records = api.events()
    assert len(records) == threads * requests_each * batch_size
    received: dict[str, list[str]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        received.setdefault(record.key.decode(), []).append(json.loads(record.value)["event_id"])
    assert received == sent


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
    assert letter.raw() == chunk * 4  # what was read before the limit, kept for the person who looks


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


# ------------------------------------------------------------------------------------------------- auth


@pytest.mark.parametrize("authorization", [None, "Bearer", "Bearer wrong-key", "Basic dXNlcjpwYXNz", "bearer  "])
def test_a_missing_or_unknown_key_gets_401_and_nothing_is_stored(api: Api, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = api.client.post("/v1/events", content=json.dumps([event()]), headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert api.events() == []
    assert api.letters() == []
    assert api.metric("liveloop_ingest_unauthorized_requests_total") == 1


def test_another_tenants_key_is_rejected_per_item(api: Api) -> None:
    ours, theirs = event(tenant=OTHER_TENANT), event(tenant="default")
    response = api.post([ours, theirs], tenant=OTHER_TENANT)
    assert response.status_code == 200
    results = response.json()["results"]
    assert results[0]["status"] == "accepted"
    assert results[1] == {
        "index": 1,
        "status": "rejected",
        "reason": "tenant 'default' does not match the API key's tenant 'acme'",
        "field": "tenant",
    }
    assert [json.loads(r.value)["tenant"] for r in api.events()] == [OTHER_TENANT]
    (letter,) = api.letters()
    assert letter.tenant == OTHER_TENANT
    assert letter.field == "tenant"
    assert api.metric("liveloop_ingest_events_rejected_total", reason="tenant_mismatch") == 1


# ---------------------------------------------------------------------------------------- privacy, secrets


def test_privacy_mode_events_are_acknowledged_but_never_written(api: Api) -> None:
    private = [event("generation", "private-1", privacy_mode=True) for _ in range(3)]
    private[0]["payload"]["prompt"] = "my very private prompt"
    public = event("generation", "public-1")
    response = api.post([*private, public])
    results = response.json()["results"]
    assert results[:3] == [
        {"index": i, "status": "accepted", "event_id": item["event_id"], "stored": False}
        for i, item in enumerate(private)
    ]
    assert results[3] == {"index": 3, "status": "accepted", "event_id": public["event_id"]}
    assert [r.key for r in api.events()] == [b"public-1"]
    assert api.metric("liveloop_ingest_events_privacy_dropped_total") == 3
    assert api.metric("liveloop_ingest_events_accepted_total") == 1


def test_a_rejected_privacy_mode_event_is_dead_lettered_without_its_payload(api: Api) -> None:
    bad = event("generation", "private-2", privacy_mode=True, colour="red")
    bad["payload"]["prompt"] = "my very private prompt"
    response = api.post([bad])
    assert response.json()["results"][0]["status"] == "rejected"
    (letter,) = api.letters()
    assert letter.raw() == b""
    assert letter.raw_size > 0
    assert "payload withheld: privacy_mode is true" in letter.reason
    assert b"private prompt" not in letter.to_json()


def test_secrets_never_reach_either_topic(api: Api) -> None:
    secret_text = f"here is my key {GITHUB_TOKEN} and {AWS_KEY_ID}"
    accepted = event("generation")
    accepted["payload"]["prompt"] = secret_text
    rejected = event("generation", colour="red")  # rejected for the extra field, dead-lettered with its prompt
    rejected["payload"]["prompt"] = secret_text
    assert api.post([accepted, rejected]).status_code == 200
    stored = b"".join(r.value for r in api.events()) + b"".join(letter.raw() for letter in api.letters())
    assert b"[REDACTED:github_token]" in stored
    assert GITHUB_TOKEN.encode() not in stored
    assert AWS_KEY_ID.encode() not in stored


# ----------------------------------------------------------------------------------- property-based


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    return st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=12,
    )


def _mutated_events() -> st.SearchStrategy[Any]:
    """Valid events with one envelope or payload field replaced by an arbitrary value, or removed."""
    fields = ["event_id", "type", "ts", "session_id", "user_id", "tenant", "privacy_mode", "schema_version", "payload"]

    def mutate(kind: str, field: str, value: Any, drop: bool) -> dict[str, Any]:
        item = event(kind)
        if drop:
            item.pop(field, None)
        else:
            item[field] = value
        return item

    kinds = st.sampled_from(["suggestion.accepted", "rating", "generation", "session.started"])
    return st.builds(mutate, kinds, st.sampled_from(fields), _json_values(), st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_json_values() | _mutated_events() | st.lists(_mutated_events(), max_size=5))
def test_any_json_body_gets_an_answer_never_a_server_error(api: Api, body: Any) -> None:
    # One app serves every example: its state (counters, topics) does not affect the answer.
    response = api.post(None, raw=json.dumps(body).encode())
    _assert_sound(response)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300) | st.text(max_size=100).map(str.encode))
def test_any_bytes_get_an_answer_never_a_server_error(api: Api, raw: bytes) -> None:
    _assert_sound(api.post(None, raw=raw))


def _assert_sound(response: Any) -> None:
    assert response.status_code in (200, 400, 413, 422), response.text
    body = response.json()
    if response.status_code in (400, 413):
        assert body["detail"]
        return
    for result in body["results"]:
        assert result["status"] in ("accepted", "rejected")
        if result["status"] == "rejected":
            assert isinstance(result["reason"], str)
            assert result["reason"].strip()
    assert body["accepted"] + body["rejected"] == len(body["results"])


# --------------------------------------------------------------------------------- probes, availability


def test_health_readiness_and_metrics(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    assert api.client.get("/readyz").json() == {"ready": True}
    api.post([event()])
    metrics = api.client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in (
        "liveloop_ingest_events_accepted_total 1.0",
        "liveloop_ingest_events_privacy_dropped_total",
        "liveloop_ingest_request_seconds_bucket",
        'liveloop_ingest_request_seconds_count{code="200"} 1.0',
    ):
        assert name in metrics.text


def test_without_kafka_requests_get_503_with_retry_after(
    start_api: Callable[..., Api], credentials_file: tuple[Path, dict[str, str]]
) -> None:
    from tests.conftest import free_port

    api = start_api(bootstrap=f"127.0.0.1:{free_port()}", produce_timeout_s=2.0, retry_after_s=7)
    assert api.client.get("/healthz").status_code == 200
    ready = api.client.get("/readyz")
    assert ready.status_code == 503
    assert "cannot connect to Kafka" in ready.json()["detail"]
    response = api.post([event()])
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "7"
    assert "nothing was accepted" in response.json()["detail"]
    assert "results" not in response.json()
    assert api.metric("liveloop_ingest_unavailable_responses_total") == 1


def test_a_topic_that_does_not_exist_makes_the_api_unready(start_api: Callable[..., Api]) -> None:
    api = start_api(events_topic=f"missing.{uuid.uuid4().hex[:8]}")
    ready = api.client.get("/readyz")
    assert ready.status_code == 503
    assert "do not exist" in ready.json()["detail"]


# --------------------------------------------------------------------------------------------- settings


def test_settings_come_from_the_environment_and_default_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVELOOP_INGEST_PORT", "9123")
    monkeypatch.setenv("LIVELOOP_INGEST_MAX_BATCH_ITEMS", "50")
    loaded = IngestSettings()
    assert (loaded.host, loaded.port, loaded.max_batch_items) == ("127.0.0.1", 9123, 50)
    assert (loaded.events_topic, loaded.dlq_topic) == ("liveloop.events", "liveloop.events.dlq")


def test_bad_settings_are_all_reported_at_once() -> None:
    with pytest.raises(ValidationError) as caught:
        IngestSettings(port=0, max_batch_items=0, events_topic="no spaces", produce_timeout_s=-1)
    assert {error["loc"][0] for error in caught.value.errors()} == {
        "port",
        "max_batch_items",
        "events_topic",
        "produce_timeout_s",
    }


def test_a_missing_credential_file_stops_the_app_at_creation(tmp_path: Path) -> None:
    from infra.errors import CredentialsError

    with pytest.raises(CredentialsError, match="does not exist"):
        create_app(IngestSettings(credentials_path=tmp_path / "nope.json"))


def test_worker_processes_give_the_same_answers_as_inline(start_api: Callable[..., Api]) -> None:
    api = start_api(cpu_workers=1)
    big = [event("generation", f"sess-{i % 4}") for i in range(60)]  # over the offload threshold
    big[3]["payload"]["prompt"] = f"key {GITHUB_TOKEN}"
    big[7]["colour"] = "red"
    response = api.post(big)
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results].count("rejected") == 1
    assert results[7]["field"] == "colour"
    records = api.events()
    assert len(records) == 59
    assert all(GITHUB_TOKEN.encode() not in r.value for r in records)
    assert len(api.letters()) == 1
    assert api.post(None, raw=b"[" + b" " * 20_000).status_code == 400  # a whole-body rejection from a worker


@pytest.mark.timeout(300)
def test_a_broker_outage_gives_503_and_the_api_recovers_by_itself(stack: Stack, start_api: Callable[..., Api]) -> None:
    api = start_api(produce_timeout_s=3.0)
    before = event()
    assert api.post([before]).status_code == 200
    assert stack.kafka.stop()
    try:
        response = api.post([event()])
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "5"
        assert "results" not in response.json()
        assert api.client.get("/readyz").status_code == 503
    finally:
        stack.kafka.start()
        assert wait_until(stack.kafka_healthy, timeout_s=90)
    after = event()
    deadline = time.monotonic() + 60
    while (response := api.post([after])).status_code == 503:  # the producer reconnects on its own
        assert time.monotonic() < deadline, response.text
        time.sleep(1)
    assert response.status_code == 200
    # At least once: what was reported accepted is there (a 503'd event may be there too; its retry reuses the id).
    stored = {json.loads(record.value)["event_id"] for record in api.events()}
    assert {before["event_id"], after["event_id"]} <= stored
