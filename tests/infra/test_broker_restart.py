"""The broker keeps its topics and their messages across a restart (data lives in the state folder)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kafka import KafkaConsumer, KafkaProducer

from infra.processes import wait_until
from infra.settings import TopicSpec
from infra.stack import Stack
from infra.topics import ensure_topics


@pytest.mark.timeout(180)
def test_topics_and_messages_survive_a_broker_restart(stack: Stack, make_topic: Callable[..., str]) -> None:
    bootstrap = stack.endpoints.kafka_bootstrap
    topic = make_topic(partitions=3)
    sent = {f"m{i}".encode() for i in range(300)}
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for value in sorted(sent):
            producer.send(topic, key=value[-1:], value=value)
        producer.flush(timeout=30)
    finally:
        producer.close()

    assert stack.kafka.stop()
    assert not stack.kafka_healthy()
    stack.kafka.start()
    assert wait_until(stack.kafka_healthy, timeout_s=90), "the broker did not come back"

    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )  # fmt: skip
    try:
        received = [record.value for record in consumer]
    finally:
        consumer.close()
    assert sorted(received) == sorted(sent)
    # Provisioning after the restart finds the topic as it was: nothing to create.
    assert ensure_topics(bootstrap, [TopicSpec(name=topic, partitions=3)]) == {topic: "checked"}
