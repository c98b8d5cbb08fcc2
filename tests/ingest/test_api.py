"""The HTTP ingest API, against the real broker: what is accepted lands on the events topic (redacted,
keyed by session), keys are checked per tenant, private sessions and secrets never reach a topic.
Refusals are in ``test_api_refusals.py``, operation (probes, settings, outages) in ``test_api_operations.py``.

Every test runs its own app (``TestClient`` as a context manager runs the lifespan, which connects the
aiokafka producer) on fresh topics, with a fresh credential file holding two tenants' keys.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable

import pytest
from kafka import KafkaProducer

from infra.stack import Endpoints
from ingest.events import event_to_json, parse_event
from ingest.redaction import redact_event
from tests.ingest.api_harness import AWS_KEY_ID, GITHUB_TOKEN, OTHER_TENANT, Api, event

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
