"""The archiver: raw events and dead letters from Kafka into the audit store, each exactly once.

Poll a batch from the events and dead-letter topics, write it in ONE transaction (``COPY`` into a
temporary staging table, then ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``), and only once that
committed, commit the batch's Kafka offsets. A crash before the database commit loses nothing (the
records come again); a crash between the two commits re-delivers stored records, which the conflict
clause drops. A batch retried after a lost database connection is safe for the same reason.

Records that cannot be stored as events (they fail to parse, which ingest should have prevented, or
hold values the table cannot represent) become dead letters with source ``archiver``: never a crash,
never a silent skip. Privacy-mode events are counted and dropped, never stored anywhere.
Run as a process: ``python -m ingest.archiver`` (settings from ``LIVELOOP_ARCHIVER_*``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any
from uuid import UUID

import psycopg
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry, Counter, start_http_server
from psycopg import sql
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from ingest.dead_letters import DeadLetter, says_private
from ingest.decoding import shorten
from ingest.errors import IngestError, InvalidEvent
from ingest.events import Event, parse_event
from ingest.settings import ArchiverSettings

log = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1

# A registry of this module's own: importing the module twice (tests, ``python -m``) makes a second
# registry rather than registering the same names twice in the process-wide default one.
REGISTRY = CollectorRegistry()


def _counter(name: str, doc: str) -> Counter:
    return Counter(f"liveloop_archiver_{name}", doc, registry=REGISTRY)


ROWS_ARCHIVED = _counter("rows_archived", "Events newly written to the events table.")
DUPLICATES_SKIPPED = _counter("duplicates_skipped", "Events not written because their event_id was stored.")
PRIVACY_DROPPED = _counter("privacy_dropped", "Privacy-mode events dropped, never stored.")
DEAD_LETTERS_ARCHIVED = _counter("dead_letters_archived", "Dead letters newly written to the dead_letters table.")

EVENT_COLUMNS = (
    *("event_id", "schema_version", "type", "ts", "session_id", "user_id", "tenant"),
    *("generation_id", "policy_version", "body", "kafka_partition", "kafka_offset"),
)
LETTER_COLUMNS = ("received_at", "source", "reason", "tenant", "session_id", "raw", "kafka_partition", "kafka_offset")
# Binary COPY: no text formatting and parsing of uuids, timestamps and numbers on either side.
EVENT_TYPES = ("uuid", "int4", "text", "timestamptz", "text", "text", "text", "uuid", "int4", "jsonb", "int4", "int8")
EventRow = tuple[UUID, int, str, datetime, str, str, str, UUID | None, int | None, Jsonb, int, int]
LetterRow = tuple[datetime, str, str, str | None, str | None, bytes, int | None, int | None]


class ArchiverError(IngestError):
    """The audit store refused a batch for a reason a retry cannot fix (e.g. not migrated): crash and fix it."""


def _unstorable(policy_version: int | None) -> str | None:
    """Why a valid event cannot be stored faithfully in the events table, or None. (A NUL, which
    PostgreSQL cannot hold either, never gets this far: parse_event refuses it.)"""
    if policy_version is not None and policy_version > _INT32_MAX:
        return f"policy_version {policy_version} does not fit the events table's integer column"
    return None


def _letter(raw: bytes, reason: str, where: str, tenant: str | None = None, session: str | None = None) -> LetterRow:
    """A record the archiver itself rejects. It has no DLQ position: ``where``, in the reason, identifies it."""
    letter = DeadLetter.of(raw, f"archiver: {where}: {reason}", "archiver", tenant=tenant, session_id=session)
    row = (datetime.now(UTC), "archiver", _text(letter.reason) or "", _text(letter.tenant), _text(letter.session_id))
    return (*row, letter.raw(), None, None)


def _text(value: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL; a dead letter's metadata must never fail its whole batch.
    return None if value is None else value.replace("\x00", "\\0")


@dataclass
class Batch:
    """What one transaction writes, and the Kafka offsets to commit once it is written."""

    events: dict[UUID, EventRow] = field(default_factory=dict)
    letters: dict[object, LetterRow] = field(default_factory=dict)
    offered: int = 0  # storable events offered, repeats included: offered - written = duplicates
    privacy_dropped: int = 0
    offsets: dict[Any, Any] = field(default_factory=dict)

    def add_event(self, event: Event, raw: bytes, partition: int, offset: int, where: str = "") -> None:
        """Add a parsed event; privacy-mode ones are dropped, unstorable ones become dead letters."""
        if event.privacy_mode:
            self.privacy_dropped += 1
            return
        policy_version: int | None = getattr(event.payload, "policy_version", None)
        problem = _unstorable(policy_version)
        if problem is not None:
            where = where or f"[{partition}]@{offset}"
            self.letters[where] = _letter(raw, problem, where, event.tenant, event.session_id)
            return
        self.offered += 1
        generation_id: UUID | None = getattr(event.payload, "generation_id", None)
        # Sent as jsonb exactly as it was on the topic: ``dumps=str`` passes the text through untouched.
        body = Jsonb(raw.decode(), dumps=str)
        row = (event.event_id, event.schema_version, event.type, event.ts, event.session_id, event.user_id)
        # The first occurrence wins, as it does in the table: a repeat inside one batch is a duplicate too.
        self.events.setdefault(
            event.event_id, (*row, event.tenant, generation_id, policy_version, body, partition, offset)
        )

    def add_unparsed(self, raw: bytes, reason: str, where: str) -> None:
        """An events-topic record that does not parse: dead-lettered (one that says it is in privacy mode
        keeps only the masked reason and its size: see :meth:`DeadLetter.of`)."""
        if says_private(raw):
            self.privacy_dropped += 1
        else:
            log.warning("%s does not parse, dead-lettered: %s", where, reason)
        self.letters[where] = _letter(raw, reason, where)

    def add_dead_letter(self, value: bytes | None, partition: int, offset: int) -> None:
        """A record of the dead-letter topic; one that is not a DeadLetter is stored with the reason why."""
        try:
            letter = DeadLetter.model_validate_json(value or b"")
            raw = letter.raw()
        except ValueError as exc:  # a ValidationError, or raw_b64 that is not base64
            why = shorten(str(exc).replace("\n", "; "), 500)
            letter = DeadLetter.of(value or b"", f"archiver: record is not a DeadLetter: {why}", "archiver")
            raw = letter.raw()
        if says_private(raw):  # rejected, yet still a privacy-mode session's data: only the withheld letter is stored
            self.privacy_dropped += 1
        letter = letter.kept()  # a letter from an older or foreign producer obeys the privacy rule here too
        row = (letter.received_at, letter.source, _text(letter.reason) or "", _text(letter.tenant))
        self.letters[(partition, offset)] = (*row, _text(letter.session_id), letter.raw(), partition, offset)


def _cols(columns: tuple[str, ...], prefix: str = "") -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(*(prefix, c) if prefix else (c,)) for c in columns)


_STAGE = "CREATE TEMP TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS AS SELECT {} FROM {} WITH NO DATA"
_PREPARE = [
    sql.SQL(_STAGE).format(sql.Identifier(f"staging_{table}"), _cols(columns), sql.Identifier(table))
    for table, columns in (("events", EVENT_COLUMNS), ("dead_letters", LETTER_COLUMNS))
]
_COPY_EVENTS = sql.SQL("COPY staging_events ({}) FROM STDIN (FORMAT BINARY)").format(_cols(EVENT_COLUMNS))
_INSERT_EVENTS = sql.SQL(
    "INSERT INTO events ({0}) SELECT {0} FROM staging_events ON CONFLICT (event_id) DO NOTHING"
).format(_cols(EVENT_COLUMNS))
_INSERT_EVENT = sql.SQL("INSERT INTO events ({}) VALUES ({}) ON CONFLICT (event_id) DO NOTHING").format(
    _cols(EVENT_COLUMNS), sql.SQL(", ").join(sql.Placeholder() * len(EVENT_COLUMNS))
)
_COPY_LETTERS = sql.SQL("COPY staging_dead_letters ({}) FROM STDIN").format(_cols(LETTER_COLUMNS))
# Letters the archiver made have no DLQ position (and NULLs never conflict): their reason, which
# names the topic position, is their identity instead.
_INSERT_LETTERS = sql.SQL(
    "INSERT INTO dead_letters ({}) SELECT {} FROM staging_dead_letters s WHERE s.kafka_partition IS NOT NULL"
    " OR NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.kafka_partition IS NULL AND d.source = s.source"
    " AND d.reason = s.reason) ON CONFLICT (kafka_partition, kafka_offset) DO NOTHING"
).format(_cols(LETTER_COLUMNS), _cols(LETTER_COLUMNS, "s"))


def prepare(conn: psycopg.Connection[Any]) -> None:
    """Create this connection's staging tables: temporary, unindexed, emptied at every commit."""
    with conn.transaction():
        for statement in _PREPARE:
            conn.execute(statement)


def write_batch(conn: psycopg.Connection[Any], batch: Batch, careful: bool = False) -> tuple[int, int]:
    """Write a batch in one transaction on a ``prepare``d autocommit connection; return (events, letters) written.

    ``careful`` inserts events one by one, each in a savepoint, and turns a row the database refuses
    into a dead letter: the fallback for a batch whose fast path failed on its data.
    """
    letters = dict(batch.letters)
    events = written_letters = 0
    with conn.transaction(), conn.cursor() as cur:
        if batch.events and not careful:
            with cur.copy(_COPY_EVENTS) as copy:
                copy.set_types(EVENT_TYPES)
                for row in batch.events.values():
                    copy.write_row(row)
            events = cur.execute(_INSERT_EVENTS).rowcount
        for row in batch.events.values() if careful else ():
            try:
                with conn.transaction():
                    events += cur.execute(_INSERT_EVENT, row).rowcount
            except (psycopg.DataError, psycopg.IntegrityError) as exc:
                where, why = f"[{row[10]}]@{row[11]}", f"the database refused the event: {shorten(str(exc), 500)}"
                letters[where] = _letter(row[9].obj.encode(), why, where, row[6], row[4])
        if letters:
            with cur.copy(_COPY_LETTERS) as copy:
                for letter in letters.values():
                    copy.write_row(letter)
            written_letters = cur.execute(_INSERT_LETTERS).rowcount
    return events, written_letters


class Archiver:
    """Consume the events and dead-letter topics into the audit store; offsets follow the database."""

    def __init__(self, settings: ArchiverSettings | None = None, **overrides: Any) -> None:
        self.settings = s = settings or ArchiverSettings(**overrides)
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        try:
            self._consumer: Any = KafkaConsumer(
                bootstrap_servers=s.bootstrap.split(","),
                group_id=s.group_id,
                client_id=f"{s.group_id}-archiver",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                isolation_level="read_committed",  # never archive an aborted transaction's records
                max_poll_records=s.batch_max_records,
                session_timeout_ms=int(s.session_timeout_s * 1000),
                heartbeat_interval_ms=int(min(3.0, s.session_timeout_s / 3) * 1000),
            )
        except KafkaError as exc:
            raise ArchiverError(
                f"cannot reach Kafka at {s.bootstrap}: {exc}; check LIVELOOP_ARCHIVER_BOOTSTRAP"
            ) from exc
        # Known topic metadata before the first join: a join without it assigns nothing and triggers an
        # immediate second rebalance (seen to stall kafka-python 3.0); and a missing topic is an error.
        missing = [t for t in (s.events_topic, s.dlq_topic) if not self._consumer.partitions_for_topic(t)]
        if missing:
            self._consumer.close(autocommit=False)
            raise ArchiverError(f"topics {missing} do not exist on {s.bootstrap}; provision them first (`liveloop up`)")
        self._consumer.subscribe([s.events_topic, s.dlq_topic])

    def __enter__(self) -> Archiver:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Leave the group without committing anything more, and close the database connection."""
        self._consumer.close(autocommit=False)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def run(self, stop: threading.Event | None = None) -> None:
        """Archive batch after batch until ``stop`` is set; the batch in progress is finished first."""
        self._stop = stop or threading.Event()
        s = self.settings
        log.info("archiving %s and %s as group %s", s.events_topic, s.dlq_topic, s.group_id)
        while not self._stop.is_set():
            self.run_once()
        log.info("stopped; the last batch was written and committed")

    def run_once(self) -> int:
        """Poll, write and commit one batch; return the rows written (events plus dead letters)."""
        records = self._poll()
        if not records:
            return 0
        batch = self._collect(records)
        written = self._write(batch)
        if written is None:
            return 0  # stopped while the database was away: nothing committed, it all comes again
        events, letters = written
        try:
            # Only after the database commit. A partition lost in a rebalance is left to its new owner.
            assigned = self._consumer.assignment()
            self._consumer.commit({tp: om for tp, om in batch.offsets.items() if tp in assigned})
        except KafkaError as exc:  # the rows are stored: a re-delivery is dropped as duplicates
            log.warning("committing offsets failed, the batch will be re-delivered: %s", exc)
        ROWS_ARCHIVED.inc(events)
        DUPLICATES_SKIPPED.inc(batch.offered - events)
        PRIVACY_DROPPED.inc(batch.privacy_dropped)
        DEAD_LETTERS_ARCHIVED.inc(letters)
        log.debug("%d records: %d events and %d dead letters written", len(records), events, letters)
        return events + letters

    def _poll(self) -> list[Any]:
        s = self.settings
        deadline = time.monotonic() + s.batch_max_wait_s
        records: list[Any] = []
        while len(records) < s.batch_max_records and not self._stop.is_set():
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            for part in self._consumer.poll(
                timeout_ms=left_ms, max_records=s.batch_max_records - len(records)
            ).values():
                records.extend(part)
        return records

    def _collect(self, records: list[Any]) -> Batch:
        batch = Batch()
        for r in records:
            batch.offsets[TopicPartition(r.topic, r.partition)] = OffsetAndMetadata(r.offset + 1, "", r.leader_epoch)
            if r.topic == self.settings.dlq_topic:
                batch.add_dead_letter(r.value, r.partition, r.offset)
                continue
            raw: bytes = r.value or b""
            where = f"{r.topic}[{r.partition}]@{r.offset}"
            try:
                event = parse_event(raw)
            except InvalidEvent as exc:
                batch.add_unparsed(raw, exc.reason, where)
                continue
            batch.add_event(event, raw, r.partition, r.offset, where)
        return batch

    def _write(self, batch: Batch) -> tuple[int, int] | None:
        careful, backoff = False, 0.5
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    dsn = self.settings.dsn.get_secret_value()
                    self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
                    prepare(self._conn)
                return write_batch(self._conn, batch, careful)
            except psycopg.OperationalError as exc:
                # Retrying the whole batch is safe: none of it is committed to Kafka, inserts are idempotent.
                log.warning("PostgreSQL unavailable, retrying the batch in %.1f s: %s", backoff, exc)
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                if self._stop.wait(backoff):
                    return None
                backoff = min(backoff * 2, 10.0)
            except (psycopg.DataError, psycopg.IntegrityError) as exc:  # a row it refuses: never retried as is
                if careful:
                    raise ArchiverError(f"the batch was refused even row by row: {exc}") from exc
                log.warning("the batch was refused (%s); writing it row by row", exc)
                careful = True
            except psycopg.Error as exc:
                raise ArchiverError(f"writing to the audit store failed: {exc}; is the database migrated?") from exc


def main() -> int:
    """Run the archiver until SIGTERM or SIGINT; the batch in progress is finished and committed first."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = ArchiverSettings()  # type: ignore[call-arg]  # the DSN comes from the environment
    except ValidationError as exc:
        log.error("invalid archiver settings (LIVELOOP_ARCHIVER_*):\n%s", exc)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if settings.metrics_port is not None:
        # prometheus_client listens on every interface unless told otherwise.
        start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=REGISTRY)
    with Archiver(settings) as archiver:
        archiver.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
