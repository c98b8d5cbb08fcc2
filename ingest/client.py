"""The embedded SDK: ``Client.emit(event)`` returns at once and the event is never lost.

Back-pressure policy, stated once: ``emit`` never blocks on the network. It validates, drops
privacy-mode events (counted, never written anywhere), redacts secrets, and appends the event to the
on-disk journal (one ``write``). A sender thread streams the journal to Kafka with an idempotent
producer (``acks=all``, batching, compression) whose in-memory buffer and in-flight window are
bounded; whatever does not fit there waits on disk, in order. While Kafka is unreachable the journal
grows up to ``journal_max_bytes``; past that ``emit`` raises ``BackPressure`` at once and writes
nothing (the caller chooses to retry or shed). Undelivered events stay in the journal across
restarts and are sent, in order, by the next client on the same journal folder.

Usable from threads (``emit`` is thread-safe) and from asyncio code (``emit`` does not block the
loop; ``await client.aflush()``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.dead_letters import says_private, withheld_reason
from ingest.decoding import JSON_NUL_BYTES, reject_nul
from ingest.errors import BrokerUnavailable, InvalidEvent
from ingest.events import Event, event_to_json, parse_event
from ingest.journal import Journal, Position
from ingest.redaction import redact_event
from ingest.settings import SdkSettings

log = logging.getLogger(__name__)


@dataclass
class ClientStats:
    """Counters of one client since it started."""

    emitted: int = 0
    delivered: int = 0
    privacy_dropped: int = 0
    redacted: dict[str, int] = field(default_factory=dict)
    send_failures: int = 0


class Client:
    """Send events to the events topic without blocking and without losing any."""

    def __init__(self, settings: SdkSettings | None = None, **overrides: Any) -> None:
        self.settings = settings or SdkSettings(**overrides)
        s = self.settings
        self.journal = Journal(s.journal_dir, segment_bytes=s.journal_segment_bytes, max_bytes=s.journal_max_bytes)
        self.stats = ClientStats()
        self._stats_lock = threading.Lock()
        self._stopping = threading.Event()
        self._producer: Any = None
        self._sender = threading.Thread(target=self._run, name="liveloop-sdk-sender", daemon=True)
        self._sender.start()

    # -- the product's side ----------------------------------------------------------------------

    def emit(self, event: Event | Mapping[str, Any] | bytes | str) -> bool:
        """Validate, redact and journal one event; return at once. False if it was dropped for privacy.

        Raises InvalidEvent (the caller's bug: nothing was written) or BackPressure (journal full).
        """
        if isinstance(event, Mapping | bytes | str):
            try:
                parsed = parse_event(event)
            except InvalidEvent as exc:
                raise _private_safe(exc, event) from None
        else:
            parsed = event
        if parsed.privacy_mode:
            with self._stats_lock:
                self.stats.privacy_dropped += 1
            return False
        clean, counts = redact_event(parsed)
        data = event_to_json(clean)
        if b"\\u0000" in data and JSON_NUL_BYTES.search(data):  # an Event object built with a NUL in its text
            reject_nul(clean.model_dump())
        self.journal.append(clean.session_id.encode("utf-8"), data)
        with self._stats_lock:
            self.stats.emitted += 1
            for kind, n in counts.items():
                self.stats.redacted[kind] = self.stats.redacted.get(kind, 0) + n
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted so far is acknowledged by Kafka; False on timeout."""
        return self.journal.wait_acknowledged(self.journal.end, timeout)

    async def aflush(self, timeout: float | None = None) -> bool:
        """``flush`` for asyncio code: waits in a worker thread, never on the event loop."""
        return await asyncio.to_thread(self.flush, timeout)

    def close(self, timeout: float = 10.0) -> bool:
        """Deliver what can be delivered within ``timeout``, then stop. Undelivered events stay journaled.

        Returns True if nothing was left undelivered.
        """
        delivered = self.flush(timeout)
        self._stopping.set()
        self.journal.wake()
        self._sender.join(timeout=timeout + 5)
        self.journal.close()
        return delivered

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the sender thread -----------------------------------------------------------------------

    def _connect(self) -> Any:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        s = self.settings
        try:
            return KafkaProducer(
                bootstrap_servers=s.bootstrap.split(","),
                client_id=s.client_id,
                acks="all",
                enable_idempotence=True,
                compression_type=s.compression,
                linger_ms=s.linger_ms,
                batch_size=256 * 1024,
                # Never block the sender for long: a broker that is away is retried from the journal.
                max_block_ms=2000,
                bootstrap_timeout_ms=2000,  # the default (30 s) kept a closed client's thread connecting
                reconnect_backoff_max_ms=2000,
            )
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka at {s.bootstrap} unreachable: {exc}") from exc

    def _run(self) -> None:
        position = self.journal.cursor
        inflight = _Inflight()
        last_sync = time.monotonic()
        backoff = 0.1
        while True:
            try:
                if self._producer is None:
                    self._producer = self._connect()
                position = self._pump(position, inflight)
                backoff = 0.1
            except Exception as exc:  # every failure is retried from the journal; nothing is dropped
                with self._stats_lock:
                    self.stats.send_failures += 1
                log.warning("liveloop SDK: sending failed, retrying from the journal: %s", exc)
                position = self._rewind(inflight)
                if self._stopping.wait(backoff):
                    break
                backoff = min(backoff * 2, 5.0)
            now = time.monotonic()
            if now - last_sync >= self.settings.fsync_interval_s:
                self.journal.sync()
                self.journal.persist_cursor()
                last_sync = now
            if self._stopping.is_set():
                break
        self._drop_producer(timeout=2)

    def _pump(self, position: Position, inflight: _Inflight) -> Position:
        """Send what the journal holds past ``position`` and collect acknowledgements; return the new position."""
        topic, limit, send = self.settings.topic, self.settings.max_in_flight, self._producer.send
        chunk = self.journal.read_chunk(position, max_records=2000)
        futures, segments, ends, segment = inflight.futures, inflight.segments, inflight.ends, chunk.segment
        for key, value, end in zip(chunk.keys, chunk.values, chunk.ends, strict=True):
            while len(futures) >= limit:
                self._settle(inflight, block=True)
            futures.append(send(topic, key=key, value=value))
            segments.append(segment)
            ends.append(end)
        if chunk.ends:
            position = Position(segment, chunk.ends[-1])
        elif segment != position.segment:
            position = Position(segment, 0)  # its own segment is read to the end: wait in the next one
        self._settle(inflight, block=False)
        if not chunk.ends:
            if futures:
                self._settle(inflight, block=True)
            elif not self._stopping.is_set():
                self.journal.wait_appended(position, timeout=0.2)
        return position

    def _settle(self, inflight: _Inflight, block: bool) -> None:
        """Acknowledge the delivered prefix of ``inflight``; raise on the first failed send."""
        futures = inflight.futures
        if block and futures and not futures[0].is_done:
            futures[0].get(timeout=30)  # raises the send's error, handled by the caller's rewind
        delivered = 0
        while futures and futures[0].is_done:
            if futures[0].failed():
                raise futures[0].exception
            futures.popleft()
            delivered += 1
        if delivered:
            for _ in range(delivered - 1):
                inflight.segments.popleft()
                inflight.ends.popleft()
            self.journal.acknowledge(Position(inflight.segments.popleft(), inflight.ends.popleft()), persist=False)
            with self._stats_lock:
                self.stats.delivered += delivered

    def _rewind(self, inflight: _Inflight) -> Position:
        """After a failure, resend from the first unacknowledged record (repeats are dropped by event_id)."""
        self._drop_producer(timeout=0)
        inflight.clear()
        return self.journal.cursor

    def _drop_producer(self, timeout: float) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=timeout)
            except Exception:  # closing a broken producer may fail in many ways; it is gone either way
                log.debug("liveloop SDK: closing the producer failed", exc_info=True)


class _Inflight:
    """Records sent but not yet acknowledged, oldest first: their futures and where each ends in the journal.

    Parallel deques of the producer's futures and of plain ints, rather than one tuple per record,
    so that the garbage collector has no extra object per event in flight to look at.
    """

    __slots__ = ("ends", "futures", "segments")

    def __init__(self) -> None:
        self.futures: collections.deque[Any] = collections.deque()
        self.segments: collections.deque[int] = collections.deque()
        self.ends: collections.deque[int] = collections.deque()

    def clear(self) -> None:
        """Forget every record in flight (they are resent from the journal)."""
        self.futures.clear()
        self.segments.clear()
        self.ends.clear()


def _private_safe(error: InvalidEvent, event: Mapping[str, Any] | bytes | str) -> InvalidEvent:
    """``error``, or for an item that says ``privacy_mode: true`` the same error with every value of the
    item masked in its reason: the caller logs or dead-letters it, and a private item must leave nothing
    that identifies its session (the rule of :meth:`ingest.dead_letters.DeadLetter.of`)."""
    if isinstance(event, bytes):
        raw = event
    elif isinstance(event, str):
        raw = event.encode("utf-8", "replace")
    else:
        raw = json.dumps(event, ensure_ascii=False, default=str).encode("utf-8", "replace")
    if not says_private(raw):
        return error
    return type(error)(withheld_reason(error.reason, raw, error.field), error.field)
