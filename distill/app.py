"""The distiller: a Faust app that turns live sessions into reward samples.

Three agents, each a stream of its own:

1. ``sessionize`` reads the events topic (keyed by session) and a ticks topic with the same
   partitions, and keeps each session's state (``distill.sessions``) in a changelog-backed table.
   An event moves the session's state machine; a tick (sent by a timer to every partition) finalises
   the generations whose windows closed, so timers survive restarts: the deadlines live in the table.
   Scored samples go to an internal topic keyed by user.
2. ``admit`` reads that topic and applies the per-user cap (a table keyed by user, so the cap holds
   across every session of the user), then publishes admitted samples to the samples topic.
3. ``archive`` reads the samples topic and stores samples with their lineage in PostgreSQL.

Delivery is at least once, without waiting for each acknowledgement: Faust flushes the producer
before it commits any offset, so a crash re-reads whatever was not committed. What a re-read cannot
re-derive (a session already marked final in a local RocksDB table) is covered by the session's
outbox, published again on the first tick after a start. Repeats carry the same deterministic
``sample_id`` and every consumer drops them.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import faust
from kafka.partitioner.default import murmur2

from distill.deadlines import DeadlineIndex
from distill.guards import UserWindow, admit_user
from distill.metrics import METRICS, render
from distill.samples import parse_sample, sample_to_json
from distill.sessions import Outcome, SessionState, apply_event, apply_tick, expired, settle_outbox
from distill.settings import DistillSettings
from distill.sink import AuditSink
from distill.spec import RewardSpec, load_spec
from infra.settings import TopicSpec
from infra.topics import ensure_topics
from ingest.dead_letters import DeadLetter
from ingest.errors import InvalidEvent
from ingest.events import parse_event

log = logging.getLogger(__name__)


# Outbox entries older than this are surely delivered: Faust commits offsets every few seconds
# (broker_commit_interval) and flushes the producer before each commit.
SETTLED_AFTER_S = 60.0


def partition_of(key: bytes, partitions: int) -> int:
    """Kafka's default partition for a key (murmur2), as every producer of the events topic uses."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def build_app(settings: DistillSettings, spec: RewardSpec | None = None) -> faust.App:
    """The distiller's Faust app, wired to ``settings``."""
    spec = spec or load_spec(settings.spec_path)
    sink = AuditSink(settings.dsn.get_secret_value())
    deadlines = DeadlineIndex(spec, SETTLED_AFTER_S)
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap}",
        store="rocksdb://" if settings.store == "rocksdb" else "memory://",
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        producer_acks=-1,
        broker_commit_interval=2.8,  # SETTLED_AFTER_S must stay well above this
        web_host=settings.web_host,
        web_bind=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
    )
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
    ticks_name = f"{settings.app_id}-ticks"
    ticks = app.topic(ticks_name, partitions=settings.partitions, internal=True, **raw)
    source = app.topic(settings.events_topic, ticks_name, **raw)
    scored = app.topic(f"{settings.app_id}-scored", partitions=settings.partitions, internal=True, **raw)
    samples = app.topic(settings.samples_topic, **raw)
    dlq = app.topic(settings.dlq_topic, **raw)
    # Tables of JSON documents; a table's changelog partition is that of the event being processed,
    # so a session's state stays on its events' partition.
    sessions = app.Table("sessions", key_type=str)
    users = app.Table("user-windows", key_type=str)

    async def publish(outcome: Outcome, state: SessionState) -> None:
        """Hand the outcome's samples on and record late feedback; the caller saves state after."""
        for sample in outcome.samples:
            await scored.send(key=sample.user_id.encode(), value=sample_to_json(sample))
        if outcome.late:
            await sink.record_late(outcome.late, state.finalised)
        METRICS.samples_scored.inc(len(outcome.samples))
        METRICS.session_capped.inc(len(outcome.capped))
        METRICS.late_feedback.inc(len(outcome.late))
        for sample in outcome.samples:
            METRICS.deferrals.labels(str(sample.policy_version)).inc(int(sample.deferral))
            METRICS.invalid_tool_calls.labels(str(sample.policy_version)).inc(sample.invalid_tool_calls)
            METRICS.generations.labels(str(sample.policy_version)).inc()

    async def on_event(key: bytes | None, value: bytes, partition: int) -> None:
        try:
            event = parse_event(value)
        except InvalidEvent as exc:
            letter = DeadLetter.of(value, exc.reason, "distill", field=exc.field)
            await (await dlq.send(key=key, value=letter.to_json()))
            METRICS.dead_letters.inc()
            return
        session = key.decode() if key else event.session_id
        state = SessionState.load(sessions.get(session))
        wall = time.time()
        outcome = apply_event(state, event, spec, wall)
        settle_outbox(state, wall, SETTLED_AFTER_S)
        METRICS.events.inc()
        METRICS.duplicates.inc(int(outcome.duplicate))
        METRICS.privacy_dropped.inc(int(outcome.private))
        await publish(outcome, state)
        sessions[session] = state.dump()
        deadlines.update(session, partition, state)

    async def on_tick(partition: int) -> None:
        if not deadlines.built:
            await recover()
        now = datetime.now(UTC)
        wall = now.timestamp()
        for key in deadlines.due(partition, wall):
            state = SessionState.load(sessions.get(key))
            outcome = apply_tick(state, now, spec)
            await publish(outcome, state)
            settle_outbox(state, wall, SETTLED_AFTER_S)
            if expired(state, wall, spec):
                del sessions[key]
                deadlines.forget(key, partition)
            else:
                sessions[key] = state.dump()
                deadlines.update(key, partition, state)

    async def recover() -> None:
        """After a start or a rebalance, one scan of the (recovered) table: rebuild the deadline index
        and publish again every sample that may not have been delivered before a crash (this only
        sends, so it needs no partition's event context)."""
        for key, value in list(sessions.items()):
            state = SessionState.load(value)
            deadlines.update(key, partition_of(key.encode(), settings.partitions), state)
            for sample_json, _ in state.outbox.values():
                sample = parse_sample(sample_json)
                await scored.send(key=sample.user_id.encode(), value=sample_json.encode())
            METRICS.samples_republished.inc(len(state.outbox))
        deadlines.built = True

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(app: Any, revoked: Any, **kwargs: Any) -> None:
        deadlines.reset()

    @app.agent(source)
    async def sessionize(stream: Any) -> None:
        async for event in stream.events():
            if event.message.topic == ticks_name:
                await on_tick(event.message.partition)
            else:
                await on_event(event.key, event.value, event.message.partition)

    @app.timer(interval=settings.tick_interval_s, on_leader=True)  # type: ignore[untyped-decorator]
    async def tick() -> None:
        stamp = datetime.now(UTC).isoformat().encode()
        for partition in range(settings.partitions):
            await ticks.send(value=stamp, partition=partition)

    @app.agent(scored)
    async def admit(stream: Any) -> None:
        async for event in stream.events():
            sample = parse_sample(event.value)
            entry = users.get(sample.user_id) or {}
            recent: list[str] = entry.get("admitted_ids", [])
            if sample.sample_id in recent:
                # A repeat (an outbox published again after a start) was admitted already: pass it on
                # without spending the user's cap on it twice.
                await samples.send(key=sample.sample_id.encode(), value=event.value)
                METRICS.samples_published.inc()
                continue
            previous = UserWindow.model_validate(entry["window"]) if "window" in entry else None
            admitted, window = admit_user(previous, sample.generated_at, spec.guards)
            if admitted:
                # No wait for the acknowledgement: Faust flushes the producer before it commits the
                # offset of this record, so a crash re-reads the record and publishes the sample again.
                await samples.send(key=sample.sample_id.encode(), value=event.value)
                METRICS.samples_published.inc()
                recent = [*recent, sample.sample_id][-spec.guards.max_samples_per_user_per_window :]
            else:
                METRICS.user_capped.inc()
            users[sample.user_id] = {"window": window.model_dump(mode="json"), "admitted_ids": recent}

    @app.agent(samples)
    async def archive(stream: Any) -> None:
        await sink.record_spec(spec)
        async for batch in stream.take(500, within=0.2):
            await sink.write_samples([parse_sample(value) for value in batch])

    @app.page("/healthz")
    async def healthz(web: Any, request: Any) -> Any:
        return web.json({"ok": True})

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        body, content_type = render()
        # aiohttp takes the charset separately from the content type.
        return web.bytes(body, content_type=content_type.split(";")[0])

    return app


def internal_topics(settings: DistillSettings) -> list[TopicSpec]:
    """The app's own topics, co-partitioned with the events topic; provisioned before the worker starts."""
    return [
        TopicSpec(name=f"{settings.app_id}-ticks", partitions=settings.partitions, retention_ms=3600_000),
        TopicSpec(name=f"{settings.app_id}-scored", partitions=settings.partitions),
    ]


def main() -> None:
    """Run the distiller as a worker process (``python -m distill.app``)."""
    settings = DistillSettings()  # type: ignore[call-arg]  # dsn comes from the environment
    ensure_topics(settings.bootstrap, internal_topics(settings))
    app = build_app(settings)
    worker = faust.Worker(app, loglevel="warning")
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
