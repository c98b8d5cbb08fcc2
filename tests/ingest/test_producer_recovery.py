"""The ingest API's producer recovers from a sequence error that stops aiokafka's sender for good.

When a broker restart loses records it had acknowledged, the broker answers the idempotent producer's
next batch with ``OutOfOrderSequenceNumber``; aiokafka's sender then stops, and that producer fails
every later send. Here the real broker gives that answer to a real producer whose next sequence number
was moved ahead (what such a loss looks like from the broker's side). The API's producer must answer
"unavailable" for that delivery and then deliver again, with a new producer, without a restart.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from aiokafka.structs import TopicPartition
from kafka import KafkaConsumer

from infra.settings import TopicSpec
from infra.stack import Endpoints
from infra.topics import ensure_topics
from ingest.api_producer import EventProducer
from ingest.errors import BrokerUnavailable


def test_a_producer_whose_sequence_the_broker_rejects_is_replaced(endpoints: Endpoints) -> None:
    topic = f"producer-recovery-{uuid.uuid4().hex[:8]}"
    ensure_topics(endpoints.kafka_bootstrap, [TopicSpec(name=topic, partitions=1)])

    async def scenario() -> tuple[str, float]:
        producer = EventProducer(
            endpoints.kafka_bootstrap, client_id="recovery-test", linger_ms=0, compression=None,
            max_batch_bytes=1 << 20, timeout_s=10.0,
        )  # fmt: skip
        await producer.start()
        try:
            await producer.deliver([(topic, [(b"k", b"first")])])
            broken = producer._producer
            broken._txn_manager.increment_sequence_number(TopicPartition(topic, 0), 5)
            try:
                await producer.deliver([(topic, [(b"k", b"refused")])])
            except BrokerUnavailable as exc:
                refusal = str(exc)
            else:
                raise AssertionError("the broker accepted a batch out of sequence")
            started = time.monotonic()
            while True:  # what a client does after a 503: retry
                try:
                    await producer.deliver([(topic, [(b"k", b"after")])])
                    break
                except BrokerUnavailable:
                    assert time.monotonic() - started < 30, "the producer never delivered again"
                    await asyncio.sleep(0.2)
            assert producer._producer is not broken
            return refusal, time.monotonic() - started
        finally:
            await producer.stop()

    refusal, _ = asyncio.run(scenario())
    assert "OutOfOrderSequenceNumber" in refusal
    consumer = KafkaConsumer(topic, bootstrap_servers=endpoints.kafka_bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=5000)  # fmt: skip
    try:
        values = [record.value for record in consumer]
    finally:
        consumer.close()
    assert values == [b"first", b"after"]
