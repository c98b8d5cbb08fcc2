"""The HTTP ingest API in operation: any input gets an answer (never a server error), probes and
availability, settings, worker processes and a broker outage.

Every test runs its own app on fresh topics (fixtures in ``tests/ingest/conftest.py``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from infra.processes import wait_until
from infra.stack import Stack
from ingest.api import create_app
from ingest.settings import IngestSettings
from tests.ingest.api_harness import GITHUB_TOKEN, Api, event

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
