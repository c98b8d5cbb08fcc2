"""Looks for strings that must never be stored: planted secrets and ids of privacy-mode sessions.

Searches every place the loop keeps data, each read the way its data can be seen whole:

- every Kafka topic, record by record from the beginning (batches on disk are compressed, so the
  broker's files cannot simply be grepped);
- every table of every database on the PostgreSQL server, a row's whole text at a time
  (large values on disk are compressed too);
- every file of the local state folder: MLflow's artifact store, the checkpoints, the journals,
  the components' own state and the logs (the PostgreSQL cluster's files excepted: see above).

A finding names the place and how many records, rows or files hold a string, never the string itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import psycopg
from kafka import KafkaConsumer, TopicPartition
from psycopg import sql

from infra.stack import Stack


def scan_for_leaks(stack: Stack, secrets: Iterable[str], session_ids: Iterable[str]) -> dict[str, int]:
    """place -> number of records/rows/files holding a secret or a private session; places with none left out.

    A session id is looked for as a whole JSON string (``"sim-1"``, so that ``sim-12`` does not match
    ``sim-1``) and as a whole Kafka key; a secret anywhere.
    """
    sessions = sorted({session for session in session_ids if session})
    strings = sorted({secret for secret in secrets if secret} | {f'"{session}"' for session in sessions})
    if not strings:
        return {}
    found: dict[str, int] = {}
    found.update(_kafka(stack.endpoints.kafka_bootstrap, [s.encode() for s in strings], {s.encode() for s in sessions}))
    found.update(_postgres(stack.endpoints.dsn(), strings))
    # Every file of the local state, read as bytes: MLflow's artifacts, the learner's checkpoints and
    # journal, the gate's and the gateway's downloads, the SDK journals, the distiller's tables, the logs.
    # The PostgreSQL cluster's files are left out: its rows were read whole above.
    state = stack.settings.state_dir.resolve()
    cluster = stack.postgres.root_dir.resolve()
    for entry in sorted(state.iterdir()) if state.is_dir() else []:
        if entry.resolve() != cluster:
            found.update(_files(entry, [s.encode() for s in strings]))
    return {place: count for place, count in found.items() if count}


def _kafka(bootstrap: str, needles: list[bytes], keys: set[bytes]) -> dict[str, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000)
    found: dict[str, int] = {}
    try:
        for topic in sorted(consumer.topics()):
            if topic.startswith("__"):
                continue
            partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            ends = consumer.end_offsets(partitions)
            hits = 0
            while any(consumer.position(tp) < end for tp, end in ends.items()):
                batch = consumer.poll(timeout_ms=1000, max_records=5000)
                if not batch:
                    break
                for records in batch.values():
                    for record in records:
                        data = (record.key or b"") + b"\0" + (record.value or b"")
                        hits += record.key in keys or any(needle in data for needle in needles)
            found[f"kafka:{topic}"] = hits
    finally:
        consumer.close()
    return found


def _postgres(dsn: str, needles: list[str]) -> dict[str, int]:
    # LIKE's wildcards inside a needle ('_', '%') only widen the match: a false alarm, never a miss.
    patterns = [f"%{needle}%" for needle in needles]
    found: dict[str, int] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        databases = [row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE NOT datistemplate")]
    base = dsn.rsplit("/", 1)[0]
    for database in databases:
        with psycopg.connect(f"{base}/{database}", autocommit=True) as conn:
            tables = conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')"
            ).fetchall()
            for schema, table in tables:
                # A row's text form holds every column, but bytea shows as hex there: check those columns
                # in escape form, where printable ASCII (every planted string) stays as it is.
                binary = conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s AND data_type = 'bytea'",
                    (schema, table),
                ).fetchall()
                conditions = [sql.SQL("r::text LIKE ANY(%(p)s)")] + [
                    sql.SQL("encode(r.{c}, 'escape') LIKE ANY(%(p)s)").format(c=sql.Identifier(column))
                    for (column,) in binary
                ]
                query = sql.SQL("SELECT count(*) FROM {t} AS r WHERE {conditions}").format(
                    t=sql.Identifier(schema, table), conditions=sql.SQL(" OR ").join(conditions)
                )
                row = conn.execute(query, {"p": patterns}).fetchone()
                found[f"postgres:{database}.{schema}.{table}"] = int(row[0]) if row else 0
    return found


def _files(entry: Path, needles: list[bytes]) -> dict[str, int]:
    paths = [entry] if entry.is_file() else [path for path in entry.rglob("*") if path.is_file()]
    hits = 0
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:  # a file removed while the scan runs (a log rotated, a temporary folder)
            continue
        hits += any(needle in data for needle in needles)
    return {f"files:{entry.name}": hits}
