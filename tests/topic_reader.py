"""Reading a whole topic in tests: every record there now, up to the end offsets taken at the start."""

from __future__ import annotations

import time

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord


def read_topic(bootstrap: str, topic: str, timeout_s: float = 120.0) -> list[ConsumerRecord]:
    """Every record of ``topic`` now, partition by partition (writers in these tests answer only after
    Kafka acknowledged, so what they reported is there)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert partitions, f"topic {topic} has no partitions"
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in partitions):
            assert time.monotonic() < deadline, f"could not read {topic} to its end within {timeout_s:.0f} s"
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()
