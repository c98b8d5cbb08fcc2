"""The archiver stores every event once, drops privacy-mode events, archives dead letters, survives SIGKILL.

What is proven, on the real broker and database (no mocks):

- events sent through the SDK, some re-emitted on purpose with the same event_id, end up in ``events``
  exactly once, with the body as it was on the topic and the generation id / policy version extracted;
  privacy-mode events (sent past the SDK, straight to the topic) are never stored;
- dead letters on the DLQ topic land in ``dead_letters``; records the archiver itself cannot store
  (unparseable, a NUL character, a policy version too big for its column) become dead letters too; a
  second archiver replaying everything from the start adds nothing (both tables are idempotent);
- a row the database refuses (a constraint the archiver cannot foresee) makes the batch fall back to
  row by row: the rest is stored, that row becomes a dead letter; a database connection killed under
  the archiver is reopened and the batch retried; a topic that does not exist is reported at start;
- an archiver process SIGKILLed three times at different moments while events keep arriving, and
  restarted each time, leaves every event stored exactly once, and then exits 0 on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from infra.migrations import migrate
from infra.stack import Endpoints
from ingest.archiver import REGISTRY, Archiver, ArchiverError
from ingest.client import Client
from ingest.dead_letters import WITHHELD, DeadLetter
from ingest.events import Event, event_to_json, parse_event
from ingest.settings import ArchiverSettings

REPO = Path(__file__).resolve().parents[2]


def _event(seed: str, i: int, privacy: bool = False) -> Event:
    """Event ``i`` of a deterministic stream: session starts, generations, and feedback on them."""
    ids = uuid.uuid5(uuid.NAMESPACE_URL, f"archiver-test/{seed}/{i}")
    generation = str(uuid.uuid5(uuid.NAMESPACE_URL, f"archiver-test/{seed}/gen/{i // 4}"))
    common: dict[str, Any] = {"event_id": str(ids), "session_id": f"{seed}-s{i % 41}", "user_id": f"u{i % 7}"}
    common["privacy_mode"] = privacy
    kind = i % 4
    if kind == 0:
        payload: dict[str, Any] = {"surface": "ide.tab", "client": "archiver-test", "repo_language": "python"}
        return parse_event({**common, "type": "session.started", "payload": payload})
    if kind == 1:
        payload = {
            "generation_id": generation,
            "model": "tiny",
            "policy_version": i % 5,
            "prompt": f"def f{i}(x):\n    ",
            "completion": "return x + 1\n",
            "completion_token_ids": [3, 1, 4],
            "completion_logprobs": [-0.5, -0.25, -1.0],
            "surface": "ide.tab",
        }
        return parse_event({**common, "type": "generation", "payload": payload})
    if kind == 2:
        return parse_event({**common, "type": "suggestion.accepted", "payload": {"generation_id": generation}})
    payload = {"generation_id": generation, "thumbs": "up" if i % 8 == 3 else "down"}
    return parse_event({**common, "type": "rating", "payload": payload})


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(f"liveloop_archiver_{name}_total") or 0.0


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", client_id="archiver-test-producer")
    try:
        futures = [producer.send(topic, value=v) for v in values]
        producer.flush(timeout=30)
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close(timeout=10)


def _caught_up(bootstrap: str, group: str, topics: list[str]) -> bool:
    """Whether ``group`` has committed every partition of ``topics`` up to its end."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="archiver-test-admin")
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="archiver-test-ends", enable_auto_commit=False)
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()]
        ends = consumer.end_offsets(partitions)
        try:
            offsets = admin.list_group_offsets({group: None}).get(group, {})
        except KafkaError as exc:  # e.g. no coordinator yet on a fresh broker: not caught up yet
            if not exc.retriable:
                raise
            return False
        committed = {tp: om.offset for tp, om in offsets.items()}
        return all(committed.get(tp, 0) >= end for tp, end in ends.items())
    finally:
        consumer.close()
        admin.close()


def _wait(condition: Callable[[], bool], timeout: float, what: str, step: Callable[[], object] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        if step is None:
            time.sleep(0.2)
        else:
            step()


def _count(dsn: str, table: str = "events") -> int:
    with psycopg.connect(dsn) as conn:
        query = "SELECT count(*) FROM events" if table == "events" else "SELECT count(*) FROM dead_letters"
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def audit_db(fresh_database: str) -> str:
    migrate(fresh_database)
    return fresh_database


@pytest.fixture
def topics(make_topic: Callable[..., str]) -> tuple[str, str]:
    return make_topic(partitions=3, prefix="events"), make_topic(partitions=1, prefix="dlq")


def _settings(endpoints: Endpoints, topics: tuple[str, str], dsn: str, group: str | None = None) -> ArchiverSettings:
    return ArchiverSettings(
        bootstrap=endpoints.kafka_bootstrap,
        dsn=dsn,
        events_topic=topics[0],
        dlq_topic=topics[1],
        group_id=group or f"archiver-test-{uuid.uuid4().hex[:8]}",
        batch_max_records=500,
        batch_max_wait_s=0.2,
    )


@pytest.mark.timeout(180)
def test_events_are_stored_once_with_their_body_and_privacy_events_never(
    endpoints: Endpoints, topics: tuple[str, str], audit_db: str, tmp_path: Path
) -> None:
    seed = uuid.uuid4().hex[:8]
    events = [_event(seed, i) for i in range(3000)]
    repeats = events[::10]  # 300 events re-emitted with the same event_id
    with Client(bootstrap=endpoints.kafka_bootstrap, topic=topics[0], journal_dir=tmp_path / "journal") as client:
        for event in [*events, *repeats]:
            client.emit(event)
        assert client.emit(_event(seed, 10_000, privacy=True)) is False  # the SDK drops it itself
        assert client.flush(60)
    # Defence in depth: privacy-mode events that got past the SDK onto the topic.
    private = [_event(seed, 20_000 + i, privacy=True) for i in range(7)]
    _produce(endpoints.kafka_bootstrap, topics[0], [event_to_json(e) for e in private])

    before = {name: _sample(name) for name in ("rows_archived", "duplicates_skipped", "privacy_dropped")}
    settings = _settings(endpoints, topics, audit_db)
    with Archiver(settings) as archiver:
        _wait(
            lambda: _caught_up(endpoints.kafka_bootstrap, settings.group_id, list(topics)),
            120,
            "the archiver to commit every offset",
            step=archiver.run_once,
        )

    with psycopg.connect(audit_db) as conn:
        rows = conn.execute(
            "SELECT event_id, body, generation_id, policy_version, kafka_partition, kafka_offset FROM events"
        ).fetchall()
    stored = {str(r[0]): r for r in rows}
    assert len(rows) == len(stored) == len(events)
    assert set(stored) == {str(e.event_id) for e in events}
    for event in events:
        _, body, generation_id, policy_version, partition, offset = stored[str(event.event_id)]
        assert body == json.loads(event_to_json(event))
        assert generation_id == getattr(event.payload, "generation_id", None)
        assert policy_version == getattr(event.payload, "policy_version", None)
        assert partition in {0, 1, 2}
        assert offset >= 0
    assert not {str(e.event_id) for e in private} & set(stored)
    assert _sample("rows_archived") - before["rows_archived"] == len(events)
    assert _sample("duplicates_skipped") - before["duplicates_skipped"] == len(repeats)
    assert _sample("privacy_dropped") - before["privacy_dropped"] == len(private)


@pytest.mark.timeout(120)
def test_dead_letters_are_archived_once_and_unstorable_events_become_dead_letters(
    endpoints: Endpoints, topics: tuple[str, str], audit_db: str
) -> None:
    letters = [
        DeadLetter.of(f'{{"n": {i}, "type": "bogus"}}'.encode(), f"reason {i}", "ingest-api", None, "acme", f"s{i}")
        for i in range(20)
    ]
    letters.append(DeadLetter.of(b"\xff\xfe not utf-8", "event is not valid UTF-8", "sdk"))
    private = DeadLetter.of(b'{"privacy_mode": true, "type": "bogus"}', "unknown event type", "ingest-api")
    values = [*(d.to_json() for d in letters), b"not a dead letter", private.to_json()]
    _produce(endpoints.kafka_bootstrap, topics[1], values)
    seed = uuid.uuid4().hex[:8]
    good = _event(seed, 1)
    nul = json.loads(event_to_json(_event(seed, 5)))
    nul["payload"]["prompt"] = "a\x00b"
    huge = json.loads(event_to_json(_event(seed, 9)))
    huge["payload"]["policy_version"] = 2**40
    bad_events = [
        b'{"type": "nope"}',
        b'{"privacy_mode": true, "type": "nope"}',  # unparseable but private: a withheld dead letter
        json.dumps(nul).encode(),
        json.dumps(huge).encode(),
    ]
    _produce(endpoints.kafka_bootstrap, topics[0], [event_to_json(good), *bad_events])

    for _ in range(2):  # the second archiver replays everything from the start: it must add nothing
        settings = _settings(endpoints, topics, audit_db)
        with Archiver(settings) as archiver:
            _wait(
                lambda s=settings: _caught_up(endpoints.kafka_bootstrap, s.group_id, list(topics)),
                60,
                "the archiver to commit every offset",
                step=archiver.run_once,
            )
        assert _count(audit_db) == 1
        assert _count(audit_db, "dead_letters") == len(letters) + 2 + 4

    with psycopg.connect(audit_db) as conn:
        rows = conn.execute(
            "SELECT source, reason, tenant, session_id, raw, kafka_partition, kafka_offset FROM dead_letters"
        ).fetchall()
    from_dlq = sorted((r for r in rows if r[5] is not None), key=lambda r: r[6])  # one partition: send order
    assert len(from_dlq) == len(letters) + 2
    for letter, row in zip(letters, from_dlq[:-2], strict=True):
        assert row[:5] == (letter.source, letter.reason, letter.tenant, letter.session_id, letter.raw())
    source, reason, *_, raw, _, _ = from_dlq[-2]
    assert (source, raw) == ("archiver", b"not a dead letter")
    assert "not a DeadLetter" in reason
    # The privacy-mode payload is not stored, even as a dead letter: only its withheld letter is.
    assert from_dlq[-1][:5] == ("ingest-api", private.reason, None, None, b"")
    assert private.reason.endswith(WITHHELD)
    made = {r[1].split(": ", 2)[2]: r for r in rows if r[5] is None}  # keyed by the reason after the position
    assert all(r[0] == "archiver" and r[1].startswith(f"archiver: {topics[0]}[") for r in made.values())
    assert len(made) == 4
    withheld = next(r for reason, r in made.items() if reason.endswith(WITHHELD))
    assert (withheld[3], withheld[4]) == (None, b"")
    unknown = next(r for reason, r in made.items() if "unknown event type" in reason and WITHHELD not in reason)
    assert unknown[4] == bad_events[0]
    holds_nul = next(r for reason, r in made.items() if "NUL character" in reason)
    assert json.loads(holds_nul[4])["payload"]["prompt"] == "a\x00b"  # kept as sent (ingest refuses it)
    too_big = next(r for reason, r in made.items() if "does not fit" in reason)
    assert json.loads(too_big[4])["payload"]["policy_version"] == 2**40


@pytest.mark.timeout(120)
def test_a_row_the_database_refuses_is_dead_lettered_and_a_lost_connection_is_retried(
    endpoints: Endpoints, topics: tuple[str, str], audit_db: str
) -> None:
    with psycopg.connect(audit_db, autocommit=True) as conn:
        # A constraint the archiver cannot foresee: the batch fails as a whole and is written row by row.
        conn.execute("ALTER TABLE events ADD CONSTRAINT no_poison CHECK (session_id <> 'poison')")
    seed = uuid.uuid4().hex[:8]
    good = [_event(seed, i) for i in range(10)]
    poison = json.loads(event_to_json(_event(seed, 99)))
    poison["session_id"] = "poison"
    _produce(endpoints.kafka_bootstrap, topics[0], [*(event_to_json(e) for e in good), json.dumps(poison).encode()])
    settings = _settings(endpoints, topics, audit_db)

    def archive_all(archiver: Archiver) -> None:
        _wait(
            lambda: _caught_up(endpoints.kafka_bootstrap, settings.group_id, list(topics)),
            60,
            "the archiver to commit every offset",
            step=archiver.run_once,
        )

    with Archiver(settings) as archiver:
        archive_all(archiver)
        assert _count(audit_db) == len(good)
        with psycopg.connect(audit_db) as conn:
            letters = conn.execute("SELECT source, reason, session_id, raw FROM dead_letters").fetchall()
        assert len(letters) == 1
        source, reason, session_id, raw = letters[0]
        assert (source, session_id, json.loads(raw)) == ("archiver", "poison", poison)
        assert "no_poison" in reason

        with psycopg.connect(audit_db, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        assert killed == [(True,)], "the archiver holds exactly one connection"
        more = [_event(seed, i) for i in range(10, 30)]
        _produce(endpoints.kafka_bootstrap, topics[0], [event_to_json(e) for e in more])
        archive_all(archiver)  # the first write meets the dead connection, reconnects and retries
    assert _count(audit_db) == len(good) + len(more)


@pytest.mark.timeout(60)
def test_a_missing_topic_is_reported_at_start(endpoints: Endpoints, topics: tuple[str, str], audit_db: str) -> None:
    absent = f"absent.{uuid.uuid4().hex[:12]}"
    with pytest.raises(ArchiverError, match=rf"\['{absent}'\] do not exist"):
        Archiver(_settings(endpoints, (absent, topics[1]), audit_db))


class _Emitter:
    """Emits events through the SDK in small paced batches, with repeats, until stopped."""

    def __init__(self, bootstrap: str, topic: str, journal: Path, minimum: int) -> None:
        self.client = Client(bootstrap=bootstrap, topic=topic, journal_dir=journal)
        self.seed, self.minimum, self.sent = uuid.uuid4().hex[:8], minimum, 0
        self.ids: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="archiver-test-emitter")
        self.thread.start()

    def _run(self) -> None:
        while not (self.stop.is_set() and self.sent >= self.minimum):
            batch = [_event(self.seed, self.sent + i) for i in range(40)]
            batch += [_event(self.seed, j) for j in range(max(0, self.sent - 400), self.sent, 37)]  # repeats
            for event in batch:
                self.client.emit(event)
                self.ids.add(str(event.event_id))
            self.sent += 40
            time.sleep(0.1)  # about 350 events/s: a steady stream rather than one burst

    def finish(self) -> set[str]:
        self.stop.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the emitter did not stop"
        assert self.client.close(timeout=60), "the SDK did not deliver every event"
        return self.ids


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], subprocess.Popen[bytes]]]:
    """Start ``python -m ingest.archiver`` processes; any left running is killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (tmp_path / f"archiver-{len(started)}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ingest.archiver"], cwd=REPO, env={**os.environ, **env}, stdout=log, stderr=log
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.timeout(300)
def test_sigkilled_archiver_loses_nothing_and_duplicates_nothing(
    endpoints: Endpoints,
    topics: tuple[str, str],
    audit_db: str,
    tmp_path: Path,
    spawn: Callable[[dict[str, str]], subprocess.Popen[bytes]],
) -> None:
    env = {
        "LIVELOOP_ARCHIVER_BOOTSTRAP": endpoints.kafka_bootstrap,
        "LIVELOOP_ARCHIVER_DSN": audit_db,
        "LIVELOOP_ARCHIVER_EVENTS_TOPIC": topics[0],
        "LIVELOOP_ARCHIVER_DLQ_TOPIC": topics[1],
        "LIVELOOP_ARCHIVER_GROUP_ID": f"archiver-crash-{uuid.uuid4().hex[:8]}",
        "LIVELOOP_ARCHIVER_BATCH_MAX_RECORDS": "150",  # many small transactions: kills land between commits
        "LIVELOOP_ARCHIVER_BATCH_MAX_WAIT_S": "0.1",
        "LIVELOOP_ARCHIVER_SESSION_TIMEOUT_S": "6",  # the broker's minimum: a killed member leaves fast
    }
    emitter = _Emitter(endpoints.kafka_bootstrap, topics[0], tmp_path / "journal", minimum=6000)
    try:
        proc = spawn(env)
        # Kill when the table has grown by these many rows since the last start: early, middle, late.
        for grow_by in (300, 1500, 2500):
            start = _count(audit_db)
            _wait(lambda s=start, g=grow_by: _count(audit_db) >= s + g, 90, f"{grow_by} more rows")
            assert proc.poll() is None, f"the archiver exited with {proc.returncode}; see {tmp_path}"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc = spawn(env)
    finally:
        ids = emitter.finish()
    assert emitter.sent >= 6000
    _wait(lambda: _count(audit_db) >= len(ids), 120, f"{len(ids)} rows")
    _wait(lambda: _caught_up(endpoints.kafka_bootstrap, env["LIVELOOP_ARCHIVER_GROUP_ID"], list(topics)), 60, "offsets")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, "SIGTERM must finish the batch and exit 0"

    with psycopg.connect(audit_db) as conn:
        stored = [str(r[0]) for r in conn.execute("SELECT event_id FROM events").fetchall()]
    assert len(stored) == len(set(stored)), "an event was stored twice"
    assert len(stored) == len(ids), f"{len(stored)} rows for {len(ids)} distinct events sent"
    assert set(stored) == ids, f"missing: {sorted(ids - set(stored))[:5]}, unexpected: {sorted(set(stored) - ids)[:5]}"
