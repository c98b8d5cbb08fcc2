"""Looks for strings that must never be stored: planted secrets and ids of privacy-mode sessions.

Searches every place the loop keeps data, each read the way its data can be seen whole:

- every Kafka topic, record by record from the beginning (batches on disk are compressed, so the
  broker's files cannot simply be grepped);
- every table of every database on the PostgreSQL server, a row's whole text at a time
  (large values on disk are compressed too), and every text column compared whole with the private
  session ids (a row's text writes a plain id unquoted: ``dead_letters.session_id``);
- every file of the local state folder: MLflow's artifact store, the checkpoints, the journals,
  the components' own state and the logs (the PostgreSQL cluster's files excepted: see above); a
  RocksDB store (the distiller's tables) also key by key, since its files compress whole blocks.

The dead-letter topic and table are read like the rest: the demo's simulator sends malformed items of
private sessions too, whose dead letters must keep nothing of the session.

A finding names the place (a topic, a table, a file) and how many records, rows or planted strings it
holds, never the string itself. A topic that cannot be read to its end fails the scan: a partial read
must not pass for a clean one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import psycopg
from kafka import KafkaConsumer, TopicPartition
from psycopg import sql

from infra.stack import Stack

KAFKA_STALL_S = 60.0
"""How long the scan waits on a topic that returns nothing before its end before it fails."""


def scan_for_leaks(stack: Stack, secrets: Iterable[str], session_ids: Iterable[str]) -> dict[str, int]:
    """place -> number of records/rows/strings holding a secret or a private session; places with none left out."""
    needles, keys = planted_strings(secrets, session_ids)
    if not needles:
        return {}
    found: dict[str, int] = {}
    found.update(_kafka(stack.endpoints.kafka_bootstrap, needles, keys))
    found.update(_postgres(stack.endpoints.dsn(), [needle.decode() for needle in needles], keys))
    # The PostgreSQL cluster's files are left out: its rows were read whole above.
    found.update(scan_files(stack.settings.state_dir.resolve(), needles, keys, skip=stack.postgres.root_dir.resolve()))
    return {place: count for place, count in found.items() if count}


def planted_strings(secrets: Iterable[str], session_ids: Iterable[str]) -> tuple[list[bytes], set[bytes]]:
    """``(needles, keys)``: the byte strings to look for anywhere, and the keys that must not be stored.

    A session id is looked for as a whole JSON string (``"sim-1"``, so that ``sim-12`` does not match
    ``sim-1``), also escaped inside another JSON string (``\\"sim-1\\"``: a stored event), and as a
    whole Kafka or RocksDB key; a secret anywhere.
    """
    sessions = {session for session in session_ids if session}
    quoted = {f'"{session}"' for session in sessions} | {f'\\"{session}\\"' for session in sessions}
    needles = sorted({secret for secret in secrets if secret} | quoted)
    return [needle.encode() for needle in needles], {session.encode() for session in sessions}


def scan_files(state: Path, needles: list[bytes], keys: set[bytes], skip: Path | None = None) -> dict[str, int]:
    """``files:<path>`` and ``rocksdb:<store>`` under ``state`` -> planted strings held, for the places that
    hold any; ``skip``, a folder right under ``state``, left out.

    Every file is read as bytes: MLflow's artifacts, the learner's checkpoints and journal, the gate's
    and the gateway's downloads, the SDK journals, the distiller's tables, the logs. A RocksDB store is
    also read key by key (see :func:`_rocksdb`).
    """
    entries = [entry for entry in state.iterdir() if entry.resolve() != skip] if state.is_dir() else []
    found: dict[str, int] = {}
    for path in sorted(path for entry in entries for path in [entry, *entry.rglob("*")] if path.is_file()):
        try:
            data = path.read_bytes()
        except OSError:  # a file removed while the scan runs (a log rotated, a temporary folder)
            continue
        found[f"files:{path.relative_to(state)}"] = sum(needle in data for needle in needles)
        if path.name == "CURRENT" and any(path.parent.glob("MANIFEST-*")):
            found[f"rocksdb:{path.parent.relative_to(state)}"] = _rocksdb(path.parent, needles, keys)
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
            # An empty poll is no proof of the end (a fetch can take longer than one poll on a busy
            # machine): read on until every partition reaches its end offset, or fail.
            stalled_since = time.monotonic()
            while any(consumer.position(tp) < end for tp, end in ends.items()):
                batch = consumer.poll(timeout_ms=1000, max_records=5000)
                if batch:
                    stalled_since = time.monotonic()
                elif time.monotonic() - stalled_since > KAFKA_STALL_S:
                    raise RuntimeError(
                        f"the leak scan read nothing from {topic} for {KAFKA_STALL_S:g} s before its end offsets "
                        f"{ {tp.partition: end for tp, end in ends.items()} }; it cannot say the topic is clean"
                    )
                for records in batch.values():
                    for record in records:
                        data = (record.key or b"") + b"\0" + (record.value or b"")
                        hits += record.key in keys or any(needle in data for needle in needles)
            found[f"kafka:{topic}"] = hits
    finally:
        consumer.close()
    return found


def _postgres(dsn: str, needles: list[str], keys: set[bytes]) -> dict[str, int]:
    """``postgres:<database>.<schema>.<table>`` -> rows holding a planted string, or a private session's id
    as a whole text column (``dead_letters.session_id``: a row's text form writes it unquoted)."""
    patterns = ["%" + needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for needle in needles]
    ids = sorted(key.decode() for key in keys)
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
                # in escape form, where printable ASCII (every planted string) stays as it is. A text
                # column holding just a session id shows it unquoted: compare those columns whole.
                columns = conn.execute(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
                    "AND table_name = %s AND data_type IN ('bytea', 'text', 'character varying')",
                    (schema, table),
                ).fetchall()
                conditions: list[sql.Composable] = [sql.SQL("r::text LIKE ANY(%(p)s)")]
                for column, data_type in columns:
                    if data_type == "bytea":
                        condition = sql.SQL("encode(r.{c}, 'escape') LIKE ANY(%(p)s)")
                    elif ids:
                        condition = sql.SQL("r.{c}::text = ANY(%(k)s)")
                    else:
                        continue
                    conditions.append(condition.format(c=sql.Identifier(column)))
                query = sql.SQL("SELECT count(*) FROM {t} AS r WHERE {conditions}").format(
                    t=sql.Identifier(schema, table), conditions=sql.SQL(" OR ").join(conditions)
                )
                row = conn.execute(query, {"p": patterns, "k": ids}).fetchone()
                found[f"postgres:{database}.{schema}.{table}"] = int(row[0]) if row else 0
    return found


def _rocksdb(store: Path, needles: list[bytes], keys: set[bytes]) -> int:
    """Planted strings in the keys and values of a RocksDB store, read through RocksDB; a key in ``keys`` counts too.

    Its table files compress blocks (Snappy), where a repeated substring becomes a back-reference: a
    string stored twice, or an id sharing a prefix with one stored before, does not appear in the
    file's bytes. Opened read-only, which a writer that holds the store open allows.
    """
    # A read-only reader pins no files, so a compaction by the running writer can delete one under it:
    # read again. (rocksdict raises plain Exceptions.)
    for _ in range(2):
        try:
            return _held_in_store(store, needles, keys)
        except Exception:
            time.sleep(0.5)
    return _held_in_store(store, needles, keys)  # a third failure is the scan's


def _held_in_store(store: Path, needles: list[bytes], keys: set[bytes]) -> int:
    from rocksdict import AccessType, Options, Rdict

    held: set[bytes] = set()
    db = Rdict(str(store), options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        for key, value in db.items():
            assert isinstance(key, bytes)  # raw mode: keys and values come back as the bytes stored
            assert isinstance(value, bytes)
            data = key + b"\0" + value
            held.update(needle for needle in needles if needle in data)
            if key in keys:
                held.add(key)
    finally:
        db.close()
    return len(held)
