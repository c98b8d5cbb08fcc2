"""The HTTP ingest API's Kafka side: one idempotent aiokafka producer, batching across requests.

``AIOKafkaProducer.send`` costs tens of microseconds of Python per message, as much as validating
the event. Here every request appends its records to one open record batch per topic-partition,
shared by all requests in flight, and the batch is handed to the producer whole
(``send_batch``) as soon as the partition's previous batch has left. While one produce request is
on the wire the next batch fills up with the records of every request that arrives meanwhile, so
throughput grows with load instead of paying a round trip per HTTP request.

Partitions are chosen like kafka-python's (and Java's) default partitioner: murmur2 of the key (the
session id), so every event of a session lands on one partition, the same one the SDK would pick,
and batches of one partition are handed over in the order they were opened.

Failures become :class:`~ingest.errors.BrokerUnavailable`: the caller answers 503 and the client
retries with the same event ids (consumers drop duplicates), so an event is never reported accepted
before the broker acknowledged it (``acks=all``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, OutOfOrderSequenceNumber, ProducerFenced
from kafka.partitioner.default import murmur2

from ingest.errors import BrokerUnavailable

log = logging.getLogger(__name__)

_UNRECOVERABLE = (OutOfOrderSequenceNumber, ProducerFenced)
"""Errors after which an idempotent producer fails every later send (see ``_replace_if_broken``)."""

Record = tuple[bytes | None, bytes]
"""(key, value) of one Kafka record."""


@functools.lru_cache(maxsize=1 << 16)
def key_hash(key: bytes) -> int:
    """murmur2 of ``key`` as the default partitioner uses it; cached, as sessions send many events."""
    return int(murmur2(key)) & 0x7FFFFFFF


class _Lane:
    """One topic-partition: its open batch, and the hand-over of the last batch opened."""

    __slots__ = ("builder", "delivered", "handed_over")

    def __init__(self) -> None:
        self.builder: Any = None  # aiokafka BatchBuilder still taking records, if any
        self.delivered: asyncio.Future[None] | None = None
        self.handed_over: asyncio.Future[None] | None = None


class EventProducer:
    """Deliver records to Kafka and wait for the broker's acknowledgement, many requests per batch."""

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str,
        linger_ms: int,
        compression: str | None,
        max_batch_bytes: int,
        timeout_s: float,
    ) -> None:
        self.bootstrap = bootstrap
        self._options: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "client_id": client_id,
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": linger_ms,
            "compression_type": compression,
            "max_batch_size": max_batch_bytes,
            "max_request_size": max_batch_bytes,
            "request_timeout_ms": int(timeout_s * 1000),
        }
        self._timeout_s = timeout_s
        self._producer: Any = None
        self._problem = "not started"
        self._connecting: asyncio.Task[None] | None = None
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._spread = itertools.count()

    @property
    def connected(self) -> bool:
        """Whether a producer is started (it reconnects to the broker by itself from then on)."""
        return self._producer is not None

    async def start(self) -> None:
        """Connect; if Kafka is down, keep trying in the background (requests get 503 meanwhile)."""
        if not await self._try_connect():
            self._connecting = asyncio.create_task(self._connect_until_done())

    async def stop(self) -> None:
        """Deliver what was accepted for delivery, then close the connections."""
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self._timeout_s)
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        for task in set(self._tasks):  # still waiting on a broker that never answered
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._problem = "stopped"

    async def problem(self, topics: Iterable[str]) -> str | None:
        """Why the producer cannot deliver to ``topics`` right now, or ``None`` when it can (readiness)."""
        producer = self._producer
        if producer is None:
            return self._problem
        try:
            cluster = await asyncio.wait_for(producer.client.fetch_all_metadata(), timeout=min(self._timeout_s, 5.0))
        except (KafkaError, OSError, TimeoutError) as exc:
            return f"Kafka at {self.bootstrap} is unreachable: {exc!r}"
        missing = sorted(set(topics) - set(cluster.topics()))
        return f"topics {missing} do not exist on {self.bootstrap}; provision them (liveloop up)" if missing else None

    async def deliver(self, writes: Sequence[tuple[str, Sequence[Record]]]) -> None:
        """Write ``(topic, records)`` pairs and return once Kafka acknowledged every record.

        Raises :class:`BrokerUnavailable` when Kafka is not connected, fails, or does not acknowledge
        in time; some records may then have been written anyway (retries reuse event ids).
        """
        producer = self._producer
        if producer is None:
            raise BrokerUnavailable(self._problem)
        waits: set[asyncio.Future[None]] = set()
        try:
            for topic, records in writes:
                if not records:
                    continue
                partitions = sorted(await producer.partitions_for(topic))
                count = len(partitions)
                for key, value in records:
                    slot = key_hash(key) if key is not None else next(self._spread)
                    waits.add(self._append(producer, topic, partitions[slot % count], key, value))
        except KafkaError as exc:
            self._replace_if_broken(producer, exc)
            raise BrokerUnavailable(f"Kafka at {self.bootstrap} failed: {exc!r}") from exc
        if not waits:
            return
        # asyncio.wait, not wait_for/gather: these futures are shared with other requests and must
        # not be cancelled when this request gives up.
        done, pending = await asyncio.wait(waits, timeout=self._timeout_s)
        if pending:
            raise BrokerUnavailable(f"Kafka at {self.bootstrap} did not acknowledge within {self._timeout_s:g} s")
        for future in done:
            error = future.exception()
            if error is not None:
                raise BrokerUnavailable(str(error)) from error

    def _append(
        self, producer: Any, topic: str, partition: int, key: bytes | None, value: bytes
    ) -> asyncio.Future[None]:
        lane = self._lanes.get((topic, partition))
        if lane is None:
            lane = self._lanes[(topic, partition)] = _Lane()
        builder = lane.builder
        if builder is None or builder.append(timestamp=None, key=key, value=value) is None:
            builder = self._open(lane, producer, topic, partition)
            # An empty batch takes any first record; callers keep records under the batch size anyway.
            if builder.append(timestamp=None, key=key, value=value) is None:
                raise BrokerUnavailable(f"a {len(value)}-byte record does not fit an empty Kafka batch")
        assert lane.delivered is not None
        return lane.delivered

    def _open(self, lane: _Lane, producer: Any, topic: str, partition: int) -> Any:
        loop = asyncio.get_running_loop()
        builder = producer.create_batch()
        previous = lane.handed_over
        lane.builder, lane.delivered, lane.handed_over = builder, loop.create_future(), loop.create_future()
        task = loop.create_task(
            self._flush(lane, producer, topic, partition, builder, previous, lane.handed_over, lane.delivered)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return builder

    async def _flush(
        self,
        lane: _Lane,
        producer: Any,
        topic: str,
        partition: int,
        builder: Any,
        previous: asyncio.Future[None] | None,
        handed_over: asyncio.Future[None],
        delivered: asyncio.Future[None],
    ) -> None:
        """Hand ``builder`` over after the partition's previous batch, then resolve ``delivered``."""
        try:
            if previous is not None:
                await asyncio.wait({previous})  # keeps each partition's batches (and sessions) in order
            # The batch keeps filling while send_batch waits for the partition's queue to drain.
            acknowledged = await producer.send_batch(builder, topic, partition=partition)
            self._close(lane, builder, handed_over)  # no await since send_batch returned: nothing was missed
            await acknowledged
        except (Exception, asyncio.CancelledError) as exc:
            self._close(lane, builder, handed_over)
            self._replace_if_broken(producer, exc)
            if not delivered.done():
                delivered.set_exception(BrokerUnavailable(f"Kafka at {self.bootstrap} failed: {exc!r}"))
                delivered.exception()  # retrieved here: a request may have given up waiting already
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        delivered.set_result(None)

    @staticmethod
    def _close(lane: _Lane, builder: Any, handed_over: asyncio.Future[None]) -> None:
        if lane.builder is builder:
            lane.builder = None
        if not handed_over.done():
            handed_over.set_result(None)

    def _replace_if_broken(self, producer: Any, error: BaseException) -> None:
        """Start a new producer in the background if ``error`` means ``producer`` will never send again.

        ``OutOfOrderSequenceNumber`` means the broker lost records it had acknowledged (in a restart),
        so this idempotent producer's sequence numbers for the partition no longer match the broker's:
        aiokafka keeps them, and every later batch to that partition fails the same way. A fenced
        producer, or one whose sender stopped on an unexpected error, fails every send too. Left alone,
        the API would answer 503 until restarted. A new producer gets a new producer id, whose sequences
        start afresh; until it is connected, requests get 503 as while Kafka is down, and clients retry.
        """
        sender = producer._sender.sender_task  # aiokafka offers no public way to ask
        stopped = sender is not None and sender.done() and not sender.cancelled()  # cancelled: stopped on purpose
        if self._producer is not producer or not (isinstance(error, _UNRECOVERABLE) or stopped):
            return
        self._producer = None
        self._lanes.clear()  # their batches belong to the broken producer
        self._problem = f"Kafka at {self.bootstrap} failed and the producer is being replaced: {error!r}"
        log.warning("%s", self._problem)
        self._connecting = asyncio.get_running_loop().create_task(self._replace(producer))

    async def _replace(self, stopped: Any) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stopped.stop(), timeout=self._timeout_s)
        await self._connect_until_done()

    async def _try_connect(self) -> bool:
        producer = AIOKafkaProducer(**self._options)
        try:
            await producer.start()
        except (KafkaError, OSError) as exc:
            self._problem = f"cannot connect to Kafka at {self.bootstrap}: {exc!r}"
            log.warning("%s; retrying in the background", self._problem)
            await producer.stop()
            return False
        self._producer = producer
        self._problem = ""
        return True

    async def _connect_until_done(self) -> None:
        delay = 0.5
        while not await self._try_connect():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
