"""An audit store filled by the loop's own code, cheaply: what ``liveloop replay/audit/export`` are tested on.

Events go through the real archiver's batch writer (:func:`ingest.archiver.write_batch`, which drops the
privacy-mode ones); samples are derived from them by the stream's own scoring code
(:func:`distill.replay.replay_session`, which :mod:`distill.app` shares), stored through the distiller's
real sink (:class:`distill.sink.AuditSink`) and published to a samples topic; each checkpoint takes an
offset range of that topic, admits samples through the learner's real :class:`learner.intake.Intake` and is
recorded by :func:`learner.publish.record_checkpoint`, as the learner does.

Twelve sessions over two days: the even ones end with an accept (reward 0.75), the odd ones with a thumbs
up (0.5); six belong to one heavy user. One accept arrives after its session ended, which the stream records
as late feedback and never applies. A privacy-mode session's events are offered to the archiver (which
drops them), and one privacy-mode sample is stored as an older distiller might have: no output may show it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from kafka import KafkaProducer

from distill.replay import replay_session
from distill.samples import HeldOutRule, Sample, sample_id_for, sample_to_json
from distill.sink import AuditSink
from distill.spec import RewardSpec, load_spec
from infra.migrations import migrate
from ingest.archiver import Batch, prepare, write_batch
from ingest.events import Event, parse_event
from learner.intake import Intake
from learner.manifest import CheckpointManifest, OffsetRange, config_hash
from learner.publish import record_checkpoint
from tests.distill.stream_harness import ended, feedback, generation, simple_session, started
from tests.topic_reader import read_topic

DAY_ONE = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
DAY_TWO = DAY_ONE + timedelta(days=1)
START, END = DAY_ONE.replace(hour=0), DAY_TWO.replace(hour=0) + timedelta(days=1)
SESSIONS = 12
HEAVY_USER = "user-heavy"
PRIVATE_SESSION = "audit-private"
PRIVATE_SAMPLE_SESSION = "audit-private-sample"
FIRST_RANGE_LAST = 5
"""The first checkpoint consumes samples-topic offsets 0..5, the second the rest."""
HELD_OUT = HeldOutRule(percent=10)
MODEL = "audit-policy"


@dataclass(frozen=True)
class AuditData:
    """What was built, for the tests to compare the commands' outputs with."""

    dsn: str
    bootstrap: str
    samples_topic: str
    spec: RewardSpec
    samples: list[Sample]
    accepted: int
    events: int
    checkpoints: list[CheckpointManifest]
    trained: dict[str, list[str]]


def session_id(index: int) -> str:
    """The id of the ``index``-th session."""
    return f"audit-session-{index:02d}"


def _events() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events in arrival order, and the one the stream recorded as late (an accept after its session ended)."""
    events: list[dict[str, Any]] = []
    late: dict[str, Any] = {}
    for i in range(SESSIONS):
        ts = (DAY_ONE if i < SESSIONS // 2 else DAY_TWO) + timedelta(minutes=i)
        user = HEAVY_USER if i % 2 == 0 else f"user-{i}"
        # Fixed generation ids, so that the held-out split (a hash of each id) is the same in every run: these
        # hold out sessions 1 and 9, one sample of each checkpoint's range (random ids now and then held out
        # two of the heavy user's three, and the top contributor changed).
        sid, gen = session_id(i), uuid.uuid5(uuid.NAMESPACE_URL, f"liveloop-audit/10/{i}")
        if i % 2 == 0:
            events += simple_session(sid, gen, ts=ts, user_id=user)
        else:
            events += [
                started(sid, ts=ts, user_id=user),
                generation(sid, gen, ts=ts, user_id=user),
                feedback("rating", sid, gen, ts=ts + timedelta(seconds=1), user_id=user, thumbs="up"),
                ended(sid, ts=ts + timedelta(seconds=2), user_id=user),
            ]
            if i == 1:
                late = feedback("suggestion.accepted", sid, gen, ts=ts + timedelta(seconds=3), user_id=user)
                events.append(late)
    private = [
        {**event, "privacy_mode": True}
        for event in simple_session(PRIVATE_SESSION, uuid.uuid4(), ts=DAY_ONE, user_id="p")
    ]
    return events + private, late


def _archive(dsn: str, raw_events: list[bytes]) -> dict[str, list[Event]]:
    batch = Batch()
    by_session: dict[str, list[Event]] = {}
    for offset, raw in enumerate(raw_events):
        event = parse_event(raw)
        batch.add_event(event, raw, partition=0, offset=offset)
        if not event.privacy_mode:
            by_session.setdefault(event.session_id, []).append(event)
    assert batch.privacy_dropped == 4, "the archiver drops the privacy-mode session's events"
    with psycopg.connect(dsn, autocommit=True) as conn:
        prepare(conn)
        write_batch(conn, batch)
    return by_session


def _store_samples(dsn: str, spec: RewardSpec, samples: list[Sample], late: Event) -> None:
    async def write() -> None:
        sink = AuditSink(dsn)
        try:
            await sink.record_spec(spec)
            await sink.write_samples(samples)
            generation_id = late.payload.generation_id  # type: ignore[union-attr]
            await sink.record_late([(late, sample_id_for(generation_id, spec.spec_hash))])
        finally:
            await sink.close()

    asyncio.run(write())


def _publish(bootstrap: str, topic: str, samples: list[Sample]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for sample in samples:
            producer.send(topic, key=sample.sample_id.encode(), value=sample_to_json(sample)).get(timeout=30)
    finally:
        producer.close()


def admitted(bootstrap: str, ranges: list[OffsetRange], seen: list[str], base_version: int) -> list[str]:
    """What the learner's intake admits from the samples topic's ``ranges``: the samples a checkpoint trains on."""
    intake = Intake(base_policy_version=base_version, max_staleness=4, seen_sample_ids=seen, held_out=HELD_OUT)
    ids = []
    for record in read_topic(bootstrap, ranges[0].topic):
        inside = any(
            r.partition == record.partition and r.first_offset <= record.offset <= r.last_offset for r in ranges
        )
        sample = Sample.model_validate_json(record.value)
        if inside and intake.admit(sample) is None:
            ids.append(sample.sample_id)
    return ids


def _manifest(version: int, parent: str | None, ranges: list[OffsetRange], count: int) -> CheckpointManifest:
    return CheckpointManifest(
        checkpoint_id=f"{MODEL}-v{version:05d}",
        parent_id=parent,
        model_name=MODEL,
        base_model="tiny-llama",
        policy_version=version,
        step=version,
        sample_count=count,
        consumed=ranges,
        training_config={"lr": 1e-3},
        training_config_hash=config_hash({"lr": 1e-3}),
        code_version="test",
        files={"model.safetensors": "0" * 64},
        created_at=DAY_TWO + timedelta(hours=5),
        held_out=HELD_OUT,
    )


def build(dsn: str, bootstrap: str, samples_topic: str) -> AuditData:
    """Fill the migrated-here database ``dsn`` and the (empty, one-partition) ``samples_topic``."""
    migrate(dsn)
    spec = load_spec()
    events, late = _events()
    raw = [json.dumps(event).encode() for event in events]
    sessions = _archive(dsn, raw)
    late_ids = {uuid.UUID(late["event_id"])}
    samples = [sample for events in sessions.values() for sample in replay_session(events, late_ids, spec)]
    private = samples[0].model_copy(update={"privacy_mode": True, "session_id": PRIVATE_SAMPLE_SESSION})
    late_event = parse_event(json.dumps(late).encode())
    _store_samples(dsn, spec, [*samples, _private_sample(private, spec)], late_event)
    _publish(bootstrap, samples_topic, samples)
    checkpoints, trained, seen = [], {}, []
    parent = None
    for version, (first, last) in ((4, (0, FIRST_RANGE_LAST)), (5, (FIRST_RANGE_LAST + 1, len(samples) - 1))):
        ranges = [OffsetRange(topic=samples_topic, partition=0, first_offset=first, last_offset=last)]
        ids = admitted(bootstrap, ranges, seen, version - 1)
        manifest = _manifest(version, parent, ranges, len(ids))
        record_checkpoint(dsn, manifest, ids)
        checkpoints.append(manifest)
        trained[manifest.checkpoint_id] = ids
        seen += ids
        parent = manifest.checkpoint_id
    _gate_history(dsn, checkpoints[-1])
    accepted = sum(1 for sample in samples if "accepted" in sample.components)
    return AuditData(dsn, bootstrap, samples_topic, spec, samples, accepted, len(raw) - 4, checkpoints, trained)


def _private_sample(sample: Sample, spec: RewardSpec) -> Sample:
    """A privacy-mode sample with its own generation (and so its own id), as an older distiller might store."""
    generation_id = uuid.uuid4()
    return sample.model_copy(
        update={"generation_id": generation_id, "sample_id": sample_id_for(generation_id, spec.spec_hash)}
    )


def _gate_history(dsn: str, manifest: CheckpointManifest) -> None:
    """The gate promoted the last checkpoint; an operator rolled it back, then promoted it again."""
    evaluation = uuid.uuid4()
    version = manifest.policy_version
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO evaluations (evaluation_id, checkpoint_id, champion_version, metrics, decision, reasons) "
            "VALUES (%s, %s, %s, '{}'::jsonb, 'promote', %s::jsonb)",
            (evaluation, manifest.checkpoint_id, version - 1, json.dumps(["ok reward 0.61 >= 0.5"])),
        )
        for action, before, after, actor, evaluated in (
            ("promote", version - 1, version, "gate", evaluation),
            ("rollback", version, version - 1, "alice", None),
            ("promote", version - 1, version, "alice", None),
        ):
            conn.execute(
                "INSERT INTO promotions (model_name, action, from_version, to_version, actor, reason, evaluation_id) "
                "VALUES (%s, %s, %s, %s, %s, 'audit test', %s)",
                (MODEL, action, before, after, actor, evaluated),
            )
