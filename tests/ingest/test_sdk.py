"""The embedded SDK never loses an event: not while the broker is down, not across a killed process.

Delivery is at-least-once; consumers recognise a repeat by ``event_id``. These tests check the
stronger property users rely on: every event emitted arrives, and (counted by ``event_id``) once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaConsumer

from infra.processes import wait_until
from infra.stack import Stack
from ingest.client import Client
from ingest.errors import BackPressure, InvalidEvent, JournalError
from ingest.events import parse_event
from tests.ingest.sdk_events import event_id, session_events

ROOT = Path(__file__).resolve().parents[2]


def consume_all(bootstrap: str, topic: str, idle_ms: int = 8000) -> list[tuple[bytes, dict[str, object]]]:
    """Every (key, event JSON) on the topic, from the beginning."""
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
        consumer_timeout_ms=idle_ms,
    )  # fmt: skip
    try:
        return [(record.key, json.loads(record.value)) for record in consumer]
    finally:
        consumer.close()


def assert_each_once(received: list[tuple[bytes, dict[str, object]]], seed: str, n: int) -> None:
    counts = Counter(str(value["event_id"]) for _, value in received)
    expected = {str(event_id(seed, i)) for i in range(n)}
    assert set(counts) == expected, f"missing {len(expected - set(counts))}, unexpected {len(set(counts) - expected)}"
    repeated = {k: c for k, c in counts.items() if c > 1}
    assert not repeated, f"{len(repeated)} events arrived more than once"
    # Keyed by session, so that a session's events stay in order on one partition.
    assert all(key == str(value["session_id"]).encode() for key, value in received)


@pytest.mark.timeout(300)
def test_ten_thousand_events_survive_a_broker_outage(
    stack: Stack, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(partitions=3)
    seed = "outage"
    down = stack.kafka.stop()
    assert down
    try:
        client = Client(bootstrap=stack.endpoints.kafka_bootstrap, topic=topic, journal_dir=tmp_path / "journal")
        for event in session_events(10_000, seed):
            client.emit(event)  # returns at once although nothing can be delivered
        assert not client.flush(timeout=3)
        assert client.stats.delivered == 0
    finally:
        stack.kafka.start()
        assert wait_until(stack.kafka_healthy, timeout_s=90)
    assert client.close(timeout=120), "the SDK did not deliver its journal after the broker came back"
    assert client.stats.delivered == 10_000
    assert_each_once(consume_all(stack.endpoints.kafka_bootstrap, topic), seed, 10_000)


@pytest.mark.timeout(300)
def test_a_killed_process_loses_nothing(stack: Stack, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic(partitions=3)
    seed = "killed"
    env = dict(
        os.environ,
        LIVELOOP_SDK_BOOTSTRAP=stack.endpoints.kafka_bootstrap,
        LIVELOOP_SDK_TOPIC=topic,
        LIVELOOP_SDK_JOURNAL_DIR=str(tmp_path / "journal"),
    )
    assert stack.kafka.stop()
    try:
        emitter = subprocess.Popen(
            [sys.executable, "-m", "tests.ingest.sdk_emitter", "emit", "10000", seed],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert emitter.stdout is not None
        assert emitter.stdout.readline().strip() == "emitted"
        emitter.send_signal(signal.SIGKILL)  # a crash: no close, no flush, no atexit
        emitter.wait(timeout=10)
        emitter.stdout.close()
    finally:
        stack.kafka.start()
        assert wait_until(stack.kafka_healthy, timeout_s=90)
    restarted = subprocess.run(
        [sys.executable, "-m", "tests.ingest.sdk_emitter", "flush"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert restarted.stdout.strip() == "delivered", restarted.stdout + restarted.stderr
    assert_each_once(consume_all(stack.endpoints.kafka_bootstrap, topic), seed, 10_000)


def test_privacy_mode_events_are_never_sent(stack: Stack, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic()
    with Client(bootstrap=stack.endpoints.kafka_bootstrap, topic=topic, journal_dir=tmp_path / "j") as client:
        private = {"session_id": "secret-session", "user_id": "u", "privacy_mode": True}
        assert not client.emit({**private, "type": "session.started", "payload": {"surface": "ide.tab", "client": "c"}})
        public = next(session_events(1, "public"))
        assert client.emit(public)
        assert client.flush(timeout=30)
        assert client.stats.privacy_dropped == 1
    received = consume_all(stack.endpoints.kafka_bootstrap, topic, idle_ms=3000)
    assert [value["event_id"] for _, value in received] == [str(public.event_id)]
    # Not even the journal holds it.
    assert not any(b"secret-session" in p.read_bytes() for p in (tmp_path / "j").glob("*.seg"))


def test_secrets_are_redacted_before_they_leave_the_process(
    stack: Stack, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic()
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    event = parse_event(
        {
            "type": "generation", "session_id": "s", "user_id": "u",
            "payload": {"generation_id": str(event_id("secret", 0)), "model": "tiny", "policy_version": 1,
                        "prompt": f"token = '{token}'\n", "completion": "ok", "surface": "ide.tab"},
        }
    )  # fmt: skip
    with Client(bootstrap=stack.endpoints.kafka_bootstrap, topic=topic, journal_dir=tmp_path / "j") as client:
        client.emit(event)
        assert client.flush(timeout=30)
    ((_, value),) = consume_all(stack.endpoints.kafka_bootstrap, topic, idle_ms=3000)
    assert token not in json.dumps(value)
    assert "[REDACTED:" in str(value["payload"]["prompt"])  # type: ignore[index]
    assert not any(token.encode() in p.read_bytes() for p in (tmp_path / "j").glob("*.seg"))


def test_bad_events_raise_and_write_nothing(tmp_path: Path) -> None:
    client = Client(bootstrap="127.0.0.1:1", topic="unused", journal_dir=tmp_path / "j")
    try:
        with pytest.raises(InvalidEvent, match="unknown event type"):
            client.emit({"type": "nope", "session_id": "s", "user_id": "u", "payload": {}})
        with pytest.raises(InvalidEvent):
            client.emit(b"{not json")
        # An event object built with a NUL in its text: the audit store could never keep it.
        built = next(session_events(1, "nul")).model_copy(update={"session_id": "s\x00"})
        with pytest.raises(InvalidEvent, match="field 'session_id': text holds a NUL character"):
            client.emit(built)
        assert client.journal.size_bytes() == 0
    finally:
        client.close(timeout=0)


def test_a_full_journal_pushes_back_instead_of_dropping(tmp_path: Path) -> None:
    client = Client(
        bootstrap="127.0.0.1:1", topic="unused", journal_dir=tmp_path / "j", journal_max_bytes=1 << 20
    )  # nothing listens on port 1: every event stays journaled
    try:
        emitted = 0
        refusal = ""
        for event in session_events(100_000, "full"):
            try:
                client.emit(event)
            except BackPressure as exc:
                refusal = str(exc)
                break
            emitted += 1
        assert "retry later" in refusal
        assert 0 < emitted < 100_000
        assert client.stats.emitted == emitted
    finally:
        client.close(timeout=0)
    # Everything accepted before the push-back is still there for the next client.
    reopened = Client(bootstrap="127.0.0.1:1", topic="unused", journal_dir=tmp_path / "j")
    try:
        assert len(reopened.journal.read(reopened.journal.cursor, max_records=200_000)) == emitted
        with pytest.raises(JournalError, match="in use by another client"):
            Client(bootstrap="127.0.0.1:1", topic="unused", journal_dir=tmp_path / "j")
    finally:
        reopened.close(timeout=0)


def test_emit_from_asyncio_and_threads(stack: Stack, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic(partitions=3)
    events = list(session_events(600, "async"))
    with Client(bootstrap=stack.endpoints.kafka_bootstrap, topic=topic, journal_dir=tmp_path / "j") as client:

        async def produce() -> bool:
            async def one_session(chunk: list[object]) -> None:
                for event in chunk:
                    client.emit(event)  # type: ignore[arg-type]
                    await asyncio.sleep(0)

            await asyncio.gather(*(one_session(events[i::4]) for i in range(4)))  # type: ignore[arg-type]
            return await client.aflush(timeout=60)

        assert asyncio.run(produce())
    assert_each_once(consume_all(stack.endpoints.kafka_bootstrap, topic, idle_ms=3000), "async", 600)
