"""A malformed privacy-mode item is dead-lettered with its reason, and with nothing that identifies its
session (issue 36, point 3): its session id, user id and text appear in no key or value of the DLQ
topic and in no row of the ``dead_letters`` table, on every path that rejects input (ingest API, the
SDK and its caller, archiver, distiller), and in nothing the gateway's emitter logs.

Each item's session id, user id and text are unique strings; its type is its text, so a reason that
quotes the unknown type (``parse_event`` does) would carry it.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from infra.migrations import migrate
from infra.stack import Endpoints
from ingest.archiver import Archiver
from ingest.client import Client
from ingest.dead_letters import PARTIAL, WITHHELD, DeadLetter
from ingest.errors import InvalidEvent
from serving.emission import GenerationEmitter, RequestContext
from serving.engine import Generation
from serving.metrics import GatewayMetrics
from tests.distill.stream_harness import StreamHarness
from tests.ingest.api_harness import Api
from tests.ingest.test_archiver import _caught_up, _produce, _settings, _wait
from tests.topic_reader import read_topic


@dataclass(frozen=True)
class Private:
    """A private session's identifying strings, unique to one test."""

    session: str
    user: str
    text: str

    def item(self, **changes: Any) -> dict[str, Any]:
        """A malformed privacy-mode event: unknown type (its text), its text in the payload too."""
        item = {
            "event_id": str(uuid.uuid4()),
            "type": self.text,
            "ts": "2025-01-31T12:00:00Z",
            "session_id": self.session,
            "user_id": self.user,
            "privacy_mode": True,
            "payload": {"prompt": self.text},
        }
        return item | changes

    def strings(self) -> list[bytes]:
        return [self.session.encode(), self.user.encode(), self.text.encode()]


@pytest.fixture
def private() -> Private:
    tag = uuid.uuid4().hex[:12]
    return Private(f"priv-sess-{tag}", f"priv-user-{tag}", f"privtext{tag}")


def _assert_withheld(
    endpoints: Endpoints, dsn: str, events_topic: str, dlq_topic: str, private: Private, on_events: int = 0
) -> None:
    """The DLQ topic holds withheld dead letters with a reason and nothing of ``private``; so does the table
    once the archiver has stored them, and the ``on_events`` private items it rejects from the events topic."""
    records = read_topic(endpoints.kafka_bootstrap, dlq_topic)
    assert records, "the item must be dead-lettered"
    for record in records:
        held = (record.key or b"") + b"\0" + record.value
        assert not [s for s in private.strings() if s in held], f"the DLQ topic holds a private string: {held!r}"
        letter = DeadLetter.model_validate_json(record.value)
        assert letter.reason.endswith(WITHHELD), letter.reason
        assert len(letter.reason) > len(WITHHELD), "the reason must say more than that it withheld the item"
        assert (letter.session_id, letter.raw(), record.key) == (None, b"", None)
        assert letter.raw_size > 0
    assert _archived(endpoints, dsn, events_topic, dlq_topic, private) == len(records) + on_events


def _archived(endpoints: Endpoints, dsn: str, events_topic: str, dlq_topic: str, private: Private) -> int:
    """Run the archiver over both topics; the number of dead letters it stored, each checked to hold
    nothing of ``private`` (in any column, the payload's bytes included) and to say it withheld it."""
    migrate(dsn)
    settings = _settings(endpoints, (events_topic, dlq_topic), dsn)
    with Archiver(settings) as archiver:
        _wait(
            lambda: _caught_up(endpoints.kafka_bootstrap, settings.group_id, [events_topic, dlq_topic]),
            60,
            "the archiver to commit every offset",
            step=archiver.run_once,
        )
    with psycopg.connect(dsn) as conn:
        query = "SELECT r::text, encode(r.raw, 'escape'), r.session_id, r.reason FROM dead_letters r"
        stored = conn.execute(query).fetchall()
    for text, raw, session_id, reason in stored:
        held = f"{text}\0{raw}".encode()
        assert not [s for s in private.strings() if s in held], f"the dead_letters table holds a private string: {text}"
        assert (session_id, raw) == (None, "")
        assert reason.endswith(WITHHELD), reason
    return len(stored)


def test_ingest_api(api: Api, endpoints: Endpoints, fresh_database: str, private: Private) -> None:
    extra = private.item(type="suggestion.accepted", payload={"generation_id": str(uuid.uuid4()), "note": private.text})
    answer = api.post([private.item(), extra])
    assert [r["status"] for r in answer.json()["results"]] == ["rejected", "rejected"]
    assert not [s for s in private.strings() if s in answer.content], "the answer's reasons hold a private string"
    broken = json.dumps(private.item()).encode()[:-20]  # a body too broken to parse, still saying privacy_mode
    assert api.post(None, raw=broken).status_code == 400

    _assert_withheld(endpoints, fresh_database, api.settings.events_topic, api.settings.dlq_topic, private)
    assert len(api.letters()) == 3


def test_a_body_read_only_in_part_keeps_nothing_of_it(api: Api, private: Private) -> None:
    """Past the size limit the API stops reading, before a ``privacy_mode`` late in the body: what it
    read (the session id, the user id, the text) must not be kept, since the item may be private."""
    padding = "x" * api.settings.max_request_bytes
    body = json.dumps(private.item(payload={"prompt": private.text + padding}, privacy_mode=False))
    body = body.replace('"privacy_mode": false, ', "")[:-1] + ', "privacy_mode": true}'
    assert body.index("privacy_mode") > api.settings.max_request_bytes

    def chunks() -> Any:  # no Content-Length: the server reads until the limit, then stops
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024].encode()

    assert api.post(None, raw=chunks()).status_code == 413
    letters = api.letters()
    assert len(letters) == 1
    assert (letters[0].session_id, letters[0].raw(), letters[0].reason.endswith(PARTIAL)) == (None, b"", True)
    held = letters[0].to_json()
    assert not [s for s in private.strings() if s in held]


def test_sdk_and_its_caller(
    endpoints: Endpoints, make_topic: Callable[..., str], fresh_database: str, tmp_path: Path, private: Private
) -> None:
    events, dlq = make_topic(), make_topic()
    item = private.item()
    with Client(bootstrap=endpoints.kafka_bootstrap, topic=events, journal_dir=tmp_path / "j") as client:
        with pytest.raises(InvalidEvent) as caught:
            client.emit(item)
        for given in (json.dumps(item).encode(), json.dumps(item)):
            with pytest.raises(InvalidEvent):
                client.emit(given)
    error = caught.value
    shown = f"{error} {error!r} {error.field}".encode()
    assert not [s for s in private.strings() if s in shown], f"the SDK's error holds a private string: {shown!r}"
    assert not any(s in p.read_bytes() for p in (tmp_path / "j").rglob("*") if p.is_file() for s in private.strings())
    # The SDK's caller dead-letters what emit refused, with the error's reason and the session it knows.
    letter = DeadLetter.of(
        json.dumps(item).encode(), error.reason, "sdk", field=error.field, session_id=private.session
    )
    _produce(endpoints.kafka_bootstrap, dlq, [letter.to_json()])

    _assert_withheld(endpoints, fresh_database, events, dlq, private)


def test_archiver(endpoints: Endpoints, make_topic: Callable[..., str], fresh_database: str, private: Private) -> None:
    events, dlq = make_topic(partitions=3), make_topic()
    # Past every stage onto the events topic: an item that does not parse, yet says it is private.
    _produce(endpoints.kafka_bootstrap, events, [json.dumps(private.item()).encode()])
    reason = f"unknown event type {private.text!r}"
    # A letter written before the rule (payload withheld, session id kept), and one from a producer that
    # kept the payload: both are stored without the session, the payload or the values the reason quotes.
    legacy = DeadLetter(
        source="ingest-api", reason=reason + WITHHELD, session_id=private.session, raw_b64="", raw_size=200
    )
    payload = json.dumps(private.item()).encode()
    foreign = DeadLetter(
        source="distill",
        reason=reason,
        session_id=private.session,
        raw_b64=base64.b64encode(payload).decode(),
        raw_size=len(payload),
    )
    _produce(endpoints.kafka_bootstrap, dlq, [legacy.to_json(), foreign.to_json()])

    assert _archived(endpoints, fresh_database, events, dlq, private) == 3


@pytest.mark.timeout(240)
def test_distiller(endpoints: Endpoints, fresh_database: str, tmp_path: Path, private: Private) -> None:
    with StreamHarness(endpoints.kafka_bootstrap, fresh_database, tmp_path / "distill", name="private") as harness:
        harness.start()
        harness.wait_ready()
        harness.produce_raw([(private.session.encode(), json.dumps(private.item()).encode())])
        harness.wait_until(
            lambda: harness.metric("liveloop_distill_dead_letters_total") >= 1, 60, "the item to be dead-lettered"
        )
        assert harness.stop() == 0
        # The archiver, reading the same events topic, dead-letters the item once more itself.
        _assert_withheld(endpoints, fresh_database, harness.events_topic, harness.dlq_topic, private, on_events=1)


def test_gateway_emitter(
    endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path, private: Private, caplog: Any
) -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    context = RequestContext(private.session, private.user, "default", "ide.tab", privacy_mode=True)
    generation = Generation(
        text=private.text, prompt_token_ids=[1], token_ids=[2], logprobs=[-0.5], finish_reason="stop", policy_version=1
    )
    with Client(bootstrap=endpoints.kafka_bootstrap, topic=make_topic(), journal_dir=tmp_path / "j") as client:
        emitter = GenerationEmitter(client, "tiny", metrics)
        with caplog.at_level(logging.DEBUG):
            # A task kind the contract refuses: the validation error quotes it, and the text with it.
            emitter.emit(context, private.session, uuid.uuid4(), private.text, generation, f"{private.text} !", 1.0)
    assert metrics.registry.get_sample_value("liveloop_gateway_emit_failures_total") == 1
    logged = caplog.text.encode()
    assert not [s for s in private.strings() if s in logged], caplog.text
    assert b"privacy-mode session" in logged
