"""Benchmark: the archiver's write path into PostgreSQL against a plain ``COPY`` of the same rows.

Measured: :func:`ingest.archiver.write_batch` (``COPY`` into the temporary staging table, then
``INSERT ... SELECT ... ON CONFLICT (event_id) DO NOTHING``, one transaction per batch of 2,000) fed
with pre-parsed events. Baseline: a plain ``COPY`` of exactly the same row tuples, one transaction per
batch and in the same binary encoding, into a table made ``LIKE events INCLUDING ALL`` (same columns,
primary key and indexes). Both tables are emptied before every run, and the two sides alternate batch
by batch (who goes first alternates too), so that a noisy machine moves both.
Goal: the archiver writes at least 0.7 of what plain ``COPY`` writes.

Also recorded (``archiver_end_to_end``, informational, no goal): rows/s from Kafka to the table through
``Archiver.run_once`` (poll, parse, write, commit) against a bare kafka-python consumer reading the same
records (poll only). Never asserts on time.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from kafka import KafkaConsumer, KafkaProducer
from psycopg import sql

from infra.migrations import migrate
from infra.stack import Endpoints
from ingest.archiver import (
    EVENT_COLUMNS,
    EVENT_TYPES,
    Archiver,
    ArchiverSettings,
    Batch,
    EventRow,
    prepare,
    write_batch,
)
from ingest.events import Event, event_to_json, parse_event
from tests.bench.results import write_result

EVENTS = 20_000
BATCH = 2_000  # ArchiverSettings.batch_max_records' default
RUNS = 7
E2E_RUNS = 5


def _events(n: int) -> list[Event]:
    """A realistic mix: a session start, then generations (prompt, completion, tokens) and feedback on them."""
    events: list[Event] = []
    prompt = "".join(f"    total += item_{k}.price * item_{k}.quantity\n" for k in range(18))
    for i in range(n):
        common: dict[str, Any] = {"event_id": str(uuid.uuid4()), "session_id": f"bench-s{i // 20}", "user_id": "u1"}
        generation = str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{i // 4}"))
        if i % 20 == 0:
            body: dict[str, Any] = {"type": "session.started", "payload": {"surface": "ide.tab", "client": "bench"}}
        elif i % 4 == 1:
            payload = {
                "generation_id": generation,
                "model": "tiny",
                "policy_version": 3,
                "prompt": f"def total_{i}(items):\n    total = 0\n{prompt}",
                "completion": "    return round(total, 2)\n" * 4,
                "completion_token_ids": list(range(100, 164)),
                "completion_logprobs": [-0.125 * (k % 9) for k in range(64)],
                "latency_ms": 41.5,
                "surface": "ide.tab",
            }
            body = {"type": "generation", "payload": payload}
        elif i % 4 == 2:
            body = {"type": "suggestion.accepted", "payload": {"generation_id": generation}}
        else:
            payload = {"generation_id": generation, "fraction_remaining": 0.75, "seconds_after": 30.0}
            body = {"type": "edit.persisted", "payload": payload}
        events.append(parse_event({**common, **body}))
    return events


def _batches(events: list[Event]) -> list[Batch]:
    batches = []
    for start in range(0, len(events), BATCH):
        batch = Batch()
        for offset, event in enumerate(events[start : start + BATCH], start):
            batch.add_event(event, event_to_json(event), offset % 3, offset)
        batches.append(batch)
    return batches


def _copy(conn: psycopg.Connection[Any], statement: sql.Composable, rows: list[EventRow]) -> None:
    """The baseline: the same rows, the same binary COPY encoding, straight into the target table."""
    with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
        copy.set_types(EVENT_TYPES)
        for row in rows:
            copy.write_row(row)


def _run(conn: psycopg.Connection[Any], batches: list[Batch], run: int) -> tuple[float, float]:
    """One run over every batch, archiver and baseline alternating batch by batch: (archiver, baseline) rows/s."""
    conn.execute("TRUNCATE events, copy_baseline")
    statement = sql.SQL("COPY copy_baseline ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.SQL(", ").join(map(sql.Identifier, EVENT_COLUMNS))
    )
    spent = [0.0, 0.0]
    written = 0
    for i, batch in enumerate(batches):
        rows = list(batch.events.values())
        for side in (0, 1) if (i + run) % 2 == 0 else (1, 0):
            started = time.perf_counter()
            if side == 0:
                written += write_batch(conn, batch)[0]
            else:
                _copy(conn, statement, rows)
            spent[side] += time.perf_counter() - started
    assert written == EVENTS  # the measured path did its job; time is never asserted
    return EVENTS / spent[0], EVENTS / spent[1]


def test_archiver_write_path_against_plain_copy(fresh_database: str) -> None:
    migrate(fresh_database)
    batches = _batches(_events(EVENTS))
    archiver: list[float] = []
    baseline: list[float] = []
    replay: list[float] = []
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE copy_baseline (LIKE events INCLUDING ALL)")
        prepare(conn)
        for run in range(RUNS):
            measured, base = _run(conn, batches, run)
            archiver.append(measured)
            baseline.append(base)
            # Everything again onto the full table: the cost of a re-delivery after a crash (all conflicts).
            started = time.perf_counter()
            assert sum(write_batch(conn, batch)[0] for batch in batches) == 0
            replay.append(EVENTS / (time.perf_counter() - started))
        body_bytes = conn.execute("SELECT avg(octet_length(body::text)) FROM events").fetchone()
    write_result(
        name="archiver_write_path",
        unit="rows/s",
        value=statistics.median(archiver),
        baseline_name="plain binary COPY of the same rows into a table LIKE events INCLUDING ALL",
        baseline_value=statistics.median(baseline),
        goal_ratio=0.7,
        runs=RUNS,
        extra={
            "rows_per_run": EVENTS,
            "batch_rows": BATCH,
            "avg_body_bytes": float(body_bytes[0]) if body_bytes else None,
            "archiver_runs": archiver,
            "baseline_runs": baseline,
            "median_of_run_ratios": statistics.median(a / b for a, b in zip(archiver, baseline, strict=True)),
            "replay_all_duplicates_rows_per_s": statistics.median(replay),
        },
    )


def _produce(bootstrap: str, topic: str, events: list[Event]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, batch_size=256 * 1024)
    try:
        for event in events:
            producer.send(topic, key=event.session_id.encode(), value=event_to_json(event))
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=10)


def _steady_rate(step: Callable[[], int]) -> float:
    """Rows/s of ``step`` until EVENTS rows, timed from the end of the first step that returned rows.

    The group join and the first fetch are not part of the steady rate, on either side.
    """
    total, timed, started = 0, 0, 0.0
    while total < EVENTS:
        got = step()
        total += got
        if started:
            timed += got
        elif got:
            started = time.perf_counter()
    return timed / (time.perf_counter() - started)


def _consume_only(bootstrap: str, topics: list[str]) -> float:
    consumer = KafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=f"bench-raw-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=BATCH,
    )
    try:
        return _steady_rate(lambda: sum(len(r) for r in consumer.poll(timeout_ms=500).values()))
    finally:
        consumer.close(autocommit=False)


def _archive_e2e(bootstrap: str, topics: list[str], dsn: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE events")
    settings = ArchiverSettings(
        bootstrap=bootstrap, dsn=dsn, events_topic=topics[0], dlq_topic=topics[1], group_id=f"bench-{uuid.uuid4().hex}"
    )
    with Archiver(settings) as archiver:
        return _steady_rate(archiver.run_once)


def test_archiver_end_to_end_from_kafka(
    endpoints: Endpoints, make_topic: Callable[..., str], fresh_database: str
) -> None:
    migrate(fresh_database)
    topics = [make_topic(partitions=3, prefix="bench-events"), make_topic(partitions=1, prefix="bench-dlq")]
    _produce(endpoints.kafka_bootstrap, topics[0], _events(EVENTS))
    archived: list[float] = []
    consumed: list[float] = []
    for _ in range(E2E_RUNS):
        archived.append(_archive_e2e(endpoints.kafka_bootstrap, topics, fresh_database))
        consumed.append(_consume_only(endpoints.kafka_bootstrap, topics))
    write_result(
        name="archiver_end_to_end",
        unit="rows/s",
        value=statistics.median(archived),
        baseline_name="bare kafka-python consumer polling the same records (no parse, no database)",
        baseline_value=statistics.median(consumed),
        goal_ratio=None,
        runs=E2E_RUNS,
        extra={"goal": None, "rows_per_run": EVENTS, "archiver_runs": archived, "baseline_runs": consumed},
    )
