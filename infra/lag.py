"""Consumer lag: how many records a consumer group has yet to commit on the topics it reads."""

from __future__ import annotations

from collections.abc import Iterable

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from infra.errors import ServiceUnavailable


def consumer_lag(bootstrap: str, group: str, topics: Iterable[str]) -> int:
    """Records on ``topics`` past the group's committed offsets (all of them where nothing is committed)."""
    topics = list(topics)
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, client_id="liveloop-lag")
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=5000, client_id="liveloop-lag")
    except KafkaError as exc:
        raise ServiceUnavailable(f"cannot reach Kafka at {bootstrap} for lag: {exc}") from exc
    try:
        partitions = [
            TopicPartition(topic, p) for topic in topics for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            return 0
        committed = admin.list_group_offsets({group: partitions}).get(group, {})
        ends = consumer.end_offsets(partitions)
        begins = consumer.beginning_offsets(partitions)
        lag = 0
        for tp in partitions:
            position = committed.get(tp)
            start = position.offset if position is not None and position.offset >= 0 else begins[tp]
            lag += max(ends[tp] - start, 0)
        return lag
    except KafkaError as exc:
        raise ServiceUnavailable(f"reading the lag of {group} on {bootstrap} failed: {exc}") from exc
    finally:
        consumer.close()
        admin.close()
