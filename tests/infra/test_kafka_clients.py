"""Both Kafka client libraries the loop uses work against the real local broker.

What is proven, on a real Apache Kafka 4.x broker (no mocks):

- kafka-python (the ingest SDK, topic provisioning) and aiokafka (under Faust) can each produce keyed
  messages with ``acks=all``, consume them in a consumer group with manual commits, and resume after a
  restart from exactly the offsets that were committed: the two reads together hold every message once,
  none is lost or seen twice, and every key's messages arrive in the order they were produced.
- Two kafka-python consumers in one group split a topic's partitions between them (disjoint, covering
  all partitions) and every message is consumed by exactly one of them, from its own partitions.

Why it matters: the loop's exactly-once accounting (a sample trains a checkpoint at most once and is
never lost across crashes) and its per-session ordering (events keyed by session id) rest on these
broker and client guarantees. A broker or client that reports wrong offsets or rebalances badly would
break them silently, so they are checked here first, on the real thing.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.serializer import DefaultSerializer
from kafka.structs import OffsetAndMetadata

from infra.stack import Endpoints

MakeTopic = Callable[..., str]  # the `make_topic` fixture: make_topic(partitions=N) -> topic name

TOTAL = 1_000
KEYS = 37
FIRST_READ_AT_LEAST = 400
BATCH = 50  # records per poll: small, so the first read stops well before the end
DEADLINE_S = 60.0

# (key, index) as read, in the order a consumer returned them.
Read = list[tuple[str, int]]


def _key(i: int) -> str:
    return f"k{i % KEYS}"


def _encode(text: str) -> bytes:
    return text.encode("utf-8")


def _decode(raw: bytes | None) -> str:
    assert raw is not None, "every message in these tests has a key and a value"
    return raw.decode("utf-8")


# kafka-python 3 deprecates plain callables as (de)serializers; its own UTF-8 one does the same job.
UTF8 = DefaultSerializer()


def _produce_indexed(bootstrap: str, topic: str, indices: Iterable[int]) -> None:
    """Send one small keyed message per index with acks=all and wait until the broker has them all."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        key_serializer=UTF8,
        value_serializer=UTF8,
        client_id="liveloop-test-producer",
    )
    try:
        futures = [producer.send(topic, key=_key(i), value=str(i)) for i in indices]
        producer.flush(timeout=30)
        for future in futures:
            future.get(timeout=30)  # raises if the broker rejected any message
    finally:
        producer.close(timeout=10)


def _consumer(bootstrap: str, topic: str, group: str) -> KafkaConsumer:
    """A manually committing group member that knows the topic's partitions before it first joins.

    kafka-python 3.0.12 can lose a completed join: when the group leader joins before its first
    metadata response, it assigns nothing, rejoins once the metadata arrives, and if that rejoin
    finishes between two ``poll`` calls the result is dropped and the member waits, with no
    partitions and no heartbeats, until the broker evicts it. Fetching the metadata first avoids it.
    """
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=BATCH,
        key_deserializer=UTF8,
        value_deserializer=UTF8,
        client_id=f"liveloop-test-{uuid.uuid4().hex[:6]}",
    )
    try:
        assert consumer.partitions_for_topic(topic), f"no metadata for {topic}"
    except BaseException:
        consumer.close(autocommit=False)
        raise
    return consumer


def _assert_complete_once_in_key_order(first: Read, second: Read) -> None:
    """The two reads hold every index exactly once, and each key's indices only ever increase."""
    both = first + second
    indices = [i for _, i in both]
    duplicates = sorted({i for i in indices if indices.count(i) > 1})
    assert not duplicates, f"indices read twice: {duplicates[:20]}"
    assert sorted(indices) == list(range(TOTAL)), f"missing: {sorted(set(range(TOTAL)) - set(indices))[:20]}"
    for key, i in both:
        assert key == _key(i), f"index {i} arrived under key {key!r}"
    per_key: dict[str, list[int]] = {}
    for key, i in both:
        per_key.setdefault(key, []).append(i)
    for key, seen in per_key.items():
        assert seen == sorted(seen), f"key {key} out of order across the restart: {seen}"


@pytest.mark.timeout(120)
def test_kafka_python_resumes_from_committed_offsets(endpoints: Endpoints, make_topic: MakeTopic) -> None:
    bootstrap = endpoints.kafka_bootstrap
    topic = make_topic(partitions=3)
    group = f"test-resume-{uuid.uuid4().hex[:12]}"
    _produce_indexed(bootstrap, topic, range(TOTAL))

    first: Read = []
    processed: dict[TopicPartition, OffsetAndMetadata] = {}
    consumer = _consumer(bootstrap, topic, group)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(first) < FIRST_READ_AT_LEAST:
            assert time.monotonic() < deadline, f"first consumer stalled at {len(first)} messages"
            for tp, records in consumer.poll(timeout_ms=500).items():
                first.extend((r.key, int(r.value)) for r in records)
                last = records[-1]
                # The committed offset is the next record to process: last processed + 1.
                processed[tp] = OffsetAndMetadata(last.offset + 1, "", last.leader_epoch)
        consumer.commit(processed)
    finally:
        consumer.close(autocommit=False)
    assert FIRST_READ_AT_LEAST <= len(first) < TOTAL

    second: Read = []
    consumer = _consumer(bootstrap, topic, group)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(first) + len(second) < TOTAL:
            assert time.monotonic() < deadline, f"second consumer stalled at {len(second)} messages"
            for records in consumer.poll(timeout_ms=500).values():
                second.extend((r.key, int(r.value)) for r in records)
        # Anything more (a re-delivery) would show up here and fail the exactly-once check below.
        for records in consumer.poll(timeout_ms=1_000).values():
            second.extend((r.key, int(r.value)) for r in records)
        committed = {tp: consumer.committed(tp) for tp in processed}
    finally:
        consumer.close(autocommit=False)
    assert committed == {tp: om.offset for tp, om in processed.items()}
    _assert_complete_once_in_key_order(first, second)


async def _aiokafka_resume(bootstrap: str, topic: str, group: str) -> tuple[Read, Read]:
    """Produce, read part in one consumer, commit, read the rest in a second one; return both reads."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        key_serializer=_encode,
        value_serializer=_encode,
        client_id="liveloop-test-aioproducer",
    )
    await producer.start()
    try:
        for i in range(TOTAL):
            await producer.send(topic, key=_key(i), value=str(i))
        await producer.flush()
    finally:
        await producer.stop()

    def consumer() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            key_deserializer=_decode,
            value_deserializer=_decode,
            client_id=f"liveloop-test-{uuid.uuid4().hex[:6]}",
        )

    first: Read = []
    processed: dict[AioTopicPartition, int] = {}
    c1 = consumer()
    await c1.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(first) < FIRST_READ_AT_LEAST:
            assert time.monotonic() < deadline, f"first consumer stalled at {len(first)} messages"
            batches = await c1.getmany(timeout_ms=500, max_records=BATCH)
            for tp, records in batches.items():
                first.extend((r.key, int(r.value)) for r in records)
                processed[tp] = records[-1].offset + 1
        await c1.commit(processed)
    finally:
        await c1.stop()

    second: Read = []
    c2 = consumer()
    await c2.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(first) + len(second) < TOTAL:
            assert time.monotonic() < deadline, f"second consumer stalled at {len(second)} messages"
            for records in (await c2.getmany(timeout_ms=500, max_records=BATCH)).values():
                second.extend((r.key, int(r.value)) for r in records)
        for records in (await c2.getmany(timeout_ms=1_000)).values():
            second.extend((r.key, int(r.value)) for r in records)
        committed = {tp.partition: await c2.committed(tp) for tp in processed}
    finally:
        await c2.stop()
    assert committed == {tp.partition: offset for tp, offset in processed.items()}
    return first, second


@pytest.mark.timeout(120)
def test_aiokafka_resumes_from_committed_offsets(endpoints: Endpoints, make_topic: MakeTopic) -> None:
    topic = make_topic(partitions=3)
    group = f"test-aioresume-{uuid.uuid4().hex[:12]}"
    first, second = asyncio.run(_aiokafka_resume(endpoints.kafka_bootstrap, topic, group))
    assert FIRST_READ_AT_LEAST <= len(first) < TOTAL
    _assert_complete_once_in_key_order(first, second)


class _Member(threading.Thread):
    """Polls one group member in a thread of its own and records its assignment and what it read.

    Each member polls continuously, as a real consumer process would. Alternating short polls of two
    members in one thread makes kafka-python 3.0.12 flap: a join that completes while the other
    member is being polled is thrown away and sent again, which starts yet another rebalance.
    """

    def __init__(self, consumer: KafkaConsumer) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self._stop_polling = threading.Event()
        self._lock = threading.Lock()
        self._assignment: frozenset[int] = frozenset()
        self._reads: dict[int, list[int]] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._stop_polling.is_set():
                batch = self.consumer.poll(timeout_ms=200)
                with self._lock:
                    for tp, records in batch.items():
                        self._reads.setdefault(tp.partition, []).extend(int(r.value) for r in records)
                    self._assignment = frozenset(tp.partition for tp in self.consumer.assignment())
        except BaseException as exc:  # reported by the test thread
            self.error = exc

    def stop(self) -> None:
        self._stop_polling.set()
        self.join(timeout=30)
        assert not self.is_alive(), "a polling thread did not stop"

    def view(self) -> tuple[frozenset[int], dict[int, list[int]]]:
        """The current assignment and a copy of what was read, per partition."""
        if self.error is not None:
            raise AssertionError(f"polling failed: {self.error!r}") from self.error
        with self._lock:
            return self._assignment, {p: list(v) for p, v in self._reads.items()}


def _describe(members: Sequence[_Member]) -> str:
    parts = []
    for n, member in enumerate(members):
        assignment, reads = member.view()
        count = sum(map(len, reads.values()))
        parts.append(f"member {n}: partitions {sorted(assignment)}, read {count} from {sorted(reads)}")
    return "; ".join(parts)


def _wait(members: Sequence[_Member], done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, f"{what} not reached in {DEADLINE_S} s: {_describe(members)}"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_group_members_split_partitions_and_each_message_is_consumed_once(
    endpoints: Endpoints, make_topic: MakeTopic
) -> None:
    bootstrap = endpoints.kafka_bootstrap
    topic = make_topic(partitions=3)
    group = f"test-split-{uuid.uuid4().hex[:12]}"
    consumers: list[KafkaConsumer] = []
    members: list[_Member] = []
    try:
        for _ in range(2):
            consumers.append(_consumer(bootstrap, topic, group))
        members = [_Member(c) for c in consumers]
        for member in members:
            member.start()

        def split() -> bool:
            a, b = (m.view()[0] for m in members)
            return bool(a) and bool(b) and not a & b and a | b == {0, 1, 2}

        _wait(members, split, "a disjoint split of all 3 partitions")
        assignments = [m.view()[0] for m in members]
        assert not any(m.view()[1] for m in members), "the topic was empty while the group formed"

        total = 300
        _produce_indexed(bootstrap, topic, range(total))
        _wait(
            members,
            lambda: sum(len(v) for m in members for v in m.view()[1].values()) >= total,
            "all messages",
        )
        time.sleep(1.0)  # a duplicate delivery would turn up here
        for member in members:
            member.stop()

        described = _describe(members)
        views = [m.view() for m in members]
        assert [a for a, _ in views] == assignments, f"the group rebalanced mid-test: {described}"
        for assigned, (_, reads) in zip(assignments, views, strict=True):
            assert set(reads) <= assigned, f"read outside the assignment: {described}"
            assert reads, f"a member consumed nothing: {described}"
        indices = [i for _, reads in views for v in reads.values() for i in v]
        assert sorted(indices) == list(range(total)), f"some message was lost or consumed twice: {described}"
    finally:
        for member in members:
            if member.is_alive():
                member.stop()
        for consumer in consumers:
            consumer.close(autocommit=False)
