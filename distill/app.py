"""The distiller: a Faust app that turns live sessions into reward samples.

Two stages, each taking its input in batches: a batch reads each table key once and writes it once
(``distill.batch``), its records are sent without waiting for each acknowledgement, and its input
records are acknowledged only once it is done, so that a batch that fails part-way is never committed.

1. ``sessionize`` reads the events topic (keyed by session) and a ticks topic with the same
   partitions, whole fetches at a time (``distill.fetches``: a task of the app, not an agent, as
   Faust's per-record delivery cost more than the stage's own work), and keeps each session's state
   (``distill.sessions``) in a changelog-backed table.
   An event moves the session's state machine; a tick (sent by a timer to every partition) finalises
   the generations whose windows closed, so timers survive restarts: the deadlines live in the table.
   Scored samples go to an internal topic, on their user's partition, a batch's samples for one
   partition in one record (``distill.scored``: one record per sample cost more than scoring it).
2. ``admit``, an agent (``noack_take``), reads that topic and applies the per-user cap (a table
   keyed by user, so the cap holds across every session of the user), then publishes admitted
   samples to the samples topic and stores them with their lineage in PostgreSQL (the audit
   store), batch by batch (``distill.sink``).
   A batch is stored while the next is admitted, and its records are acknowledged once it is stored.

Delivery is at least once, without waiting for each acknowledgement: Faust flushes the producer
before it commits any offset, so a crash re-reads whatever was not committed. What a re-read cannot
re-derive (a session already marked final in a local RocksDB table) is covered by the session's
outbox, published again before the first batch after a start. Repeats carry the same deterministic
``sample_id`` and every consumer drops them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

import faust
import mode

from distill import tuning
from distill.admission import ScoredSample, UserAdmissions
from distill.batch import TableBatch
from distill.deadlines import DeadlineIndex
from distill.fetches import Fetches
from distill.metrics import METRICS, agent_guards, count_trajectories, joins, render
from distill.samples import parse_sample
from distill.scored import ScoredRecords, partition_of, samples_of
from distill.sessions import Outcome, SessionState, apply_event, apply_tick, expired, settle_outbox
from distill.settings import DistillSettings
from distill.sink import AuditSink
from distill.spec import RewardSpec, load_spec
from distill.worker import CrashExitingWorker
from infra.settings import TopicSpec
from infra.topics import ensure_topics
from ingest.api_fast import parse_clean_event
from ingest.dead_letters import DeadLetter
from ingest.errors import InvalidEvent
from ingest.events import Event, event_to_json, parse_event

log = logging.getLogger(__name__)


# Outbox entries older than this are surely delivered: Faust commits offsets every few seconds
# (broker_commit_interval) and flushes the producer before each commit.
SETTLED_AFTER_S = 60.0

SESSIONS_TABLE = "sessions"
USERS_TABLE = "user-windows"


# Faust opens one RocksDB per table and partition, each by default with three 64 MiB write buffers and a
# 2 GiB block cache: twelve of them could hold gigabytes before a flush. The tables hold small JSON values
# of live sessions and users, so small buffers and caches bound the worker's memory at little cost.
ROCKSDB_OPTIONS = {
    "write_buffer_size": 4 << 20,
    "max_write_buffer_number": 2,
    "target_file_size_base": 16 << 20,
    "block_cache_size": 16 << 20,
    "block_cache_compressed_size": 4 << 20,
}


def build_app(settings: DistillSettings, spec: RewardSpec | None = None) -> faust.App:
    """The distiller's Faust app, wired to ``settings``."""
    spec = spec or load_spec(settings.spec_path)
    sink = AuditSink(settings.dsn.get_secret_value(), retry_for_s=settings.audit_retry_s)
    deadlines = DeadlineIndex(spec, SETTLED_AFTER_S, settings.orphan_grace_s)
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap}",
        store="rocksdb://" if settings.store == "rocksdb" else "memory://",
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=0,
        producer_acks=-1,
        # Records of one batch leave together: fewer, larger produce requests.
        producer_linger=settings.producer_linger_s,
        producer_max_batch_size=1024 * 1024,
        broker_commit_interval=2.8,  # SETTLED_AFTER_S must stay well above this
        web_host=settings.web_host,
        web_bind=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        # An agent that fails ends the process (the keeper starts it again) rather than being restarted in
        # place: a fresh process re-reads everything not committed, while an agent restarted in place would
        # carry on after the batch it failed, whose records Faust may already count as processed.
        agent_supervisor=mode.CrashingSupervisor,
    )
    ticks_name = f"{settings.app_id}-ticks"
    # Pending records bound the worker's memory as an agent's buffer would (fetching waits above this).
    fetches = Fetches([settings.events_topic, ticks_name], max_pending=4 * settings.batch_max_events)
    tuning.install(app, settings.fetch_max_wait_s, fetches)
    ticks = app.topic(ticks_name, partitions=settings.partitions, internal=True, schema=tuning.RAW)
    source = app.topic(settings.events_topic, ticks_name, schema=tuning.RAW)
    app.topics.add(source)  # subscribed, though no agent reads it: its records go to ``fetches``
    scored_name = f"{settings.app_id}-scored"  # its records: distill.scored
    scored = app.topic(scored_name, partitions=settings.partitions, internal=True, schema=tuning.RAW)
    dlq = app.topic(settings.dlq_topic, schema=tuning.RAW)
    # Tables of JSON bytes, stored as they are; a key's changelog partition is that of the event that
    # brought it (see distill.batch), so a session's state stays on its events' partition.
    sessions = app.Table(SESSIONS_TABLE, key_type=bytes, value_type=bytes, options=ROCKSDB_OPTIONS)  # bytes: raw
    users = app.Table(USERS_TABLE, key_type=bytes, value_type=bytes, options=ROCKSDB_OPTIONS)
    batch_size, within = settings.batch_max_events, settings.batch_max_wait_s

    async def send(topic: str, key: bytes, value: bytes) -> None:
        """Hand a record to Faust's producer, past the topic and channel machinery (and its per-record
        futures and callbacks); the producer is what Faust flushes before it commits any offset."""
        await app.producer.send(topic, key, value, partition=None, timestamp=None, headers=None)

    async def send_scored(records: ScoredRecords) -> None:
        """Hand the collected samples to ``admit``: a few records, each on its partition (``distill.scored``)."""
        for partition, value in records.records():
            await app.producer.send(scored_name, None, value, partition=partition, timestamp=None, headers=None)

    async def publish(outcomes: list[tuple[Outcome, SessionState]]) -> None:
        """Hand the batch's samples on, without waiting for acknowledgements, record late feedback and
        dead-letter feedback that joined no generation."""
        late: list[tuple[Event, str | None]] = []
        unjoined = 0
        without_feedback = 0
        records = ScoredRecords(settings.partitions)
        # Counted per batch: a labelled counter costs a lookup and a lock per call.
        by_version: dict[int, list[int]] = {}  # policy version -> [generations, deferrals, invalid tool calls]
        capped = 0
        count_trajectories([credit for outcome, _ in outcomes for credit in outcome.trajectories])
        for outcome, state in outcomes:
            for sample, sample_json in zip(outcome.samples, outcome.sample_json, strict=True):
                records.add(sample.user_id, sample_json)
                counts = by_version.setdefault(sample.policy_version, [0, 0, 0])
                counts[0] += 1
                counts[1] += int(sample.deferral)
                counts[2] += sample.invalid_tool_calls
            late += [(event, state.finalised.get(str(_generation_id(event)))) for event in outcome.late]
            capped += len(outcome.capped)
            without_feedback += outcome.without_feedback
            for event, reason in outcome.unjoined:
                # A backend sending feedback under the wrong session learns it here, with the session to use.
                letter = DeadLetter.of(
                    event_to_json(event),
                    reason,
                    "distill",
                    field="session_id",
                    tenant=event.tenant,
                    session_id=event.session_id,
                )
                await send(settings.dlq_topic, event.session_id.encode(), letter.to_json())
                unjoined += 1
        for version, (generations, deferrals, invalid) in by_version.items():
            METRICS.generations.labels(str(version)).inc(generations)
            METRICS.deferrals.labels(str(version)).inc(deferrals)
            METRICS.invalid_tool_calls.labels(str(version)).inc(invalid)
        METRICS.samples_scored.inc(sum(counts[0] for counts in by_version.values()))
        METRICS.duplicates.inc(sum(outcome.duplicate for outcome, _ in outcomes))
        METRICS.privacy_dropped.inc(sum(outcome.private for outcome, _ in outcomes))
        METRICS.session_capped.inc(capped)
        METRICS.late_feedback.inc(len(late))
        METRICS.unjoined_feedback.inc(unjoined)
        METRICS.dead_letters.inc(unjoined)
        METRICS.without_feedback.inc(without_feedback)
        await send_scored(records)
        await sink.record_late(late)

    async def on_event(
        batch: TableBatch[SessionState],
        record: Any,
        partition: int,
        outcomes: list[tuple[Outcome, SessionState]],
        touched: dict[bytes, tuple[int, SessionState]],
    ) -> bool:
        """Apply one event (a fetched record of ``partition``) to its session and note the session in
        ``touched``; False if it was not read (it went to the dead-letter topic)."""
        key: bytes | None = record.key
        try:
            # The fast reader takes what ingest let through; anything doubtful gets parse_event's verdict.
            parsed = parse_clean_event(record.value) or parse_event(record.value)
        except InvalidEvent as exc:
            # Keyed by the session as the event was, unless the letter withholds it (privacy mode).
            session_id = key.decode("utf-8", "replace") if key else None
            letter = DeadLetter.of(record.value, exc.reason, "distill", field=exc.field, session_id=session_id)
            await (await dlq.send(key=letter.key(), value=letter.to_json()))
            METRICS.dead_letters.inc()
            return False
        session = key or parsed.session_id.encode()
        state = batch.get(session, partition)
        wall = time.time()
        outcome = apply_event(state, parsed, spec, wall)
        settle_outbox(state, wall, SETTLED_AFTER_S)
        outcomes.append((outcome, state))
        touched[session] = (partition, state)
        return True

    def index_deadlines(touched: dict[bytes, tuple[int, SessionState]]) -> None:
        """Record the next deadline of each session the events since the last call touched, once per session
        (a session's events mostly come in one batch), then forget them."""
        for session, (partition, state) in touched.items():
            deadlines.update(session, partition, state)
        touched.clear()

    def on_tick(batch: TableBatch[SessionState], partition: int, outcomes: list[tuple[Outcome, SessionState]]) -> None:
        now = datetime.now(UTC)
        wall = now.timestamp()
        for key in deadlines.due(partition, wall):
            state = batch.get(key, partition)
            outcomes.append((apply_tick(state, now, spec, settings.orphan_grace_s), state))
            settle_outbox(state, wall, SETTLED_AFTER_S)
            if expired(state, wall, spec):
                batch.delete(key)
                deadlines.forget(key, partition)
            else:
                deadlines.update(key, partition, state)

    async def recover() -> None:
        """After a start or a rebalance, one scan of the (recovered) table: rebuild the deadline index
        and publish again every sample that may not have been delivered before a crash (this only
        sends, so it needs no partition's event context)."""
        records = ScoredRecords(settings.partitions)
        for key, value in list(sessions.items()):
            state = SessionState.load(value)
            deadlines.update(key, partition_of(key, settings.partitions), state)
            for sample_json, _ in state.outbox.values():
                records.add(parse_sample(sample_json).user_id, sample_json.encode())
            METRICS.samples_republished.inc(len(state.outbox))
        await send_scored(records)
        deadlines.built = True

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(app: Any, revoked: Any, **kwargs: Any) -> None:
        deadlines.reset()

    @app.task  # type: ignore[untyped-decorator]
    async def sessionize() -> None:
        """Events and ticks, whole fetches at a time (``distill.fetches``); a failure crashes the worker."""
        consumer: Any = app.consumer  # distill.tuning's
        while True:
            async with fetches.batch(batch_size) as fetched:
                if not deadlines.built:
                    await recover()  # before this batch reads the table: it sees what was there at the start
                batch = TableBatch(sessions, SessionState.load, SessionState.dump)
                outcomes: list[tuple[Outcome, SessionState]] = []
                read = 0  # counted once per batch, as publish counts: each inc of a counter takes a lock
                touched: dict[bytes, tuple[int, SessionState]] = {}
                for part in fetched:
                    if part.tp.topic == ticks_name:
                        index_deadlines(touched)  # a tick sees every deadline the events before it moved
                        on_tick(batch, part.partition, outcomes)  # one will do: every tick says "now"
                    else:
                        for record in part.records:
                            read += await on_event(batch, record, part.partition, outcomes, touched)
                index_deadlines(touched)
                METRICS.events.inc(read)
                await publish(outcomes)
                # Samples first, then the state that says they were published: a crash in between re-reads
                # the batch (its offsets are not committed) and the outbox covers what a re-read cannot.
                await batch.write()
                consumer.ack_fetched(fetched)

    @app.timer(interval=settings.tick_interval_s, on_leader=True)  # type: ignore[untyped-decorator]
    async def tick() -> None:
        stamp = datetime.now(UTC).isoformat().encode()
        for partition in range(settings.partitions):
            await ticks.send(value=stamp, partition=partition)

    async def store(stream: Any, events: list[Any], admitted: list[bytes]) -> None:
        """Write a batch's admitted samples to the audit store, then acknowledge the batch's records."""
        await sink.write_sample_json(admitted)
        METRICS.samples_published.inc(len(admitted))
        for event in events:
            await stream.ack(event)

    crashes: set[asyncio.Task[None]] = set()

    def crash_if_failed(write: asyncio.Future[None]) -> None:
        """A write that failed ends the worker even when no later batch comes to find it out."""
        if not write.cancelled() and (error := write.exception()) is not None:
            crash = asyncio.ensure_future(app.crash(error))
            crashes.add(crash)  # held until done: the loop keeps only a weak reference to a task
            crash.add_done_callback(crashes.discard)

    @app.agent(scored)
    async def admit(stream: Any) -> None:
        await sink.record_spec(spec)
        # A batch is written to PostgreSQL while the next one is admitted: waiting for each write held
        # every sample behind the one before it. Its records are acknowledged only once it is stored
        # (Faust commits no offset past a record not acknowledged), and one write runs at a time, so
        # acknowledgements keep offset order; a crash re-reads whatever was not stored.
        storing: asyncio.Future[None] | None = None
        async for events in stream.noack_take(batch_size, within=within):
            batch = TableBatch(users, UserAdmissions.load, UserAdmissions.dump)
            admitted: list[bytes] = []
            for event in events:
                # One record holds samples of users of its partition (distill.scored), so the record's
                # partition is each user's.
                for sample_json in samples_of(event.value):
                    sample = ScoredSample.model_validate_json(sample_json)
                    if batch.get(sample.user_id.encode(), event.message.partition).admit(sample, spec.guards):
                        # No wait for the acknowledgement: Faust flushes the producer before it commits the
                        # offset of this record, so a crash re-reads the record and publishes the sample again.
                        await send(settings.samples_topic, sample.sample_id.encode(), sample_json)
                        admitted.append(sample_json)
                    else:
                        METRICS.user_capped.inc()
            await batch.write()
            # The audit store gets what the samples topic gets: a crash before the batch is stored and its
            # offsets committed re-admits it (repeats pass the cap again, and the database keeps one row per
            # sample id), so neither can miss a sample the other has for long.
            if storing is not None:
                await storing  # the batch before: a failed write ends the agent here (or in crash_if_failed)
            storing = asyncio.ensure_future(store(stream, events, admitted))
            storing.add_done_callback(crash_if_failed)

    @app.page("/healthz")
    async def healthz(web: Any, request: Any) -> Any:
        return web.json({"ok": True})

    @app.page("/status")
    async def status(web: Any, request: Any) -> Any:
        """What ``liveloop status`` shows of the distiller: that it runs (this page is served by the running
        worker, as ``/healthz`` is; a status document says ``state`` like the learner's, which tools that wait
        for a component to come back read), feedback that joined nothing, generations without any, and agent
        trajectories finalised with the number each guard fired on."""
        return web.json({"state": "running", **joins(), "agent_guards": agent_guards()})

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        body, content_type = render()
        # aiohttp takes the charset separately from the content type.
        return web.bytes(body, content_type=content_type.split(";")[0])

    return app


def _generation_id(event: Event) -> Any:
    return event.payload.generation_id  # type: ignore[union-attr]  # only feedback events are late


def internal_topics(settings: DistillSettings) -> list[TopicSpec]:
    """The app's own topics, co-partitioned with the events topic; provisioned before the worker starts.

    The tables' changelogs are among them: Faust would create them itself at start, but its consumer
    may not see a topic created that late in time for the first write to it (the write then fails).
    """
    changelogs = [
        TopicSpec(
            name=f"{settings.app_id}-{table}-changelog",
            partitions=settings.partitions,
            retention_ms=-1,
            cleanup_policy="compact",
        )
        for table in (SESSIONS_TABLE, USERS_TABLE)
    ]
    return [
        TopicSpec(name=f"{settings.app_id}-ticks", partitions=settings.partitions, retention_ms=3600_000),
        TopicSpec(name=f"{settings.app_id}-scored", partitions=settings.partitions),
        *changelogs,
    ]


def main() -> None:
    """Run the distiller as a worker process (``python -m distill.app``)."""
    settings = DistillSettings()  # type: ignore[call-arg]  # dsn comes from the environment
    ensure_topics(settings.bootstrap, internal_topics(settings), replication=settings.replication)
    app = build_app(settings)
    worker = CrashExitingWorker(app, loglevel="warning")
    # Faust's terminal spinner sets the root logger to DEBUG to spin on every record: every debug call
    # of Faust and aiokafka (several per record sent) would then build a log record to throw away.
    worker.spinner = None
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
