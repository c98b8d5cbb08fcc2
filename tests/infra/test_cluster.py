"""A three-broker local Kafka (``StackSettings.kafka_brokers=3``): KRaft quorum of three, every topic with three
replicas and ``min.insync.replicas=2``, and the loop's producers (``acks=all``, idempotent) lose nothing and
double nothing while one broker at a time is SIGKILLed and brought back.

Also the settings around it, which need no broker: the brokers' ports, the replication defaults, and a
state folder that refuses to be started with another number of brokers than it was formatted with.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType
from pydantic import ValidationError

from infra.errors import ServiceStartError
from infra.kafka_broker import KafkaBroker, KafkaCluster, cluster_id, under_replicated
from infra.processes import wait_until
from infra.producers import reliable_producer
from infra.settings import Replication, StackSettings, TopicSpec, TopicsSettings
from infra.topics import ensure_topics
from tests.conftest import free_port_run

# -- settings, no broker ----------------------------------------------------------------------------------


def test_brokers_step_their_ports_by_two_and_clients_get_them_all() -> None:
    settings = StackSettings(kafka_brokers=3)
    assert [settings.kafka_node_ports(n) for n in (1, 2, 3)] == [(9092, 9093), (9094, 9095), (9096, 9097)]
    assert settings.kafka_address == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    assert StackSettings().kafka_address == "127.0.0.1:9092"  # one broker: as it always was


def test_brokers_whose_ports_collide_are_refused() -> None:
    with pytest.raises(ValidationError, match="distinct ports"):
        StackSettings(kafka_brokers=2, kafka_port=9092, kafka_controller_port=9094)
    with pytest.raises(ValidationError, match="less than or equal to 5"):
        StackSettings(kafka_brokers=6)


def test_replication_defaults_to_three_copies_two_in_sync() -> None:
    topics = TopicsSettings()
    assert topics.replication(1) == Replication(factor=1, min_insync=1)
    assert topics.replication(3) == Replication(factor=3, min_insync=2)
    assert topics.replication(5) == Replication(factor=3, min_insync=2)
    assert TopicsSettings(replication_factor=2).replication(3) == Replication(factor=2, min_insync=1)
    with pytest.raises(ValueError, match="needs at least 3 brokers"):
        TopicsSettings(replication_factor=3).replication(1)
    with pytest.raises(ValidationError, match="exceeds replication_factor"):
        TopicsSettings(replication_factor=2, min_insync_replicas=3)


def test_a_state_folder_keeps_the_broker_count_it_was_made_with(tmp_path: Path) -> None:
    three = StackSettings(state_dir=tmp_path, kafka_brokers=3)
    first = cluster_id(three)
    assert cluster_id(three) == first  # every node is formatted with the same id
    with pytest.raises(ServiceStartError, match="cluster of 3 broker"):
        cluster_id(StackSettings(state_dir=tmp_path, kafka_brokers=1))


# -- a running three-broker cluster --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    base = free_port_run(6)
    settings = StackSettings(
        state_dir=tmp_path_factory.mktemp("cluster"),
        kafka_brokers=3,
        kafka_port=base,
        kafka_controller_port=base + 1,
        kafka_heap_opts="-Xms128m -Xmx512m",  # three JVMs beside the session's stack on a small machine
    )
    local = KafkaCluster(settings)
    try:
        local.start()
        assert wait_until(local.healthy, timeout_s=180, interval_s=0.5), "the three brokers did not come up"
        yield local
    finally:
        local.stop()


def _kill(broker: KafkaBroker) -> None:
    pid = broker.process.pid()
    assert pid is not None, f"{broker.name} is not running"
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: broker.process.pid() is None, timeout_s=10)


@pytest.mark.timeout(600)
def test_topics_have_three_replicas_and_survive_one_broker_killed_at_a_time(cluster: KafkaCluster) -> None:
    bootstrap = cluster.settings.kafka_address
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    replication = TopicsSettings().replication(3)
    assert ensure_topics(bootstrap, [TopicSpec(name=topic, partitions=6)], replication=replication) == {
        topic: "created"
    }
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        partitions = admin.describe_topics([topic])[0]["partitions"]
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        admin.close()
    assert {len(p["replica_nodes"]) for p in partitions} == {3}
    assert configs["topic"][topic]["min.insync.replicas"]["value"] == "2"
    # The same topic asked for with one replica is refused, not silently left as it is.
    with pytest.raises(Exception, match="another number of replicas"):
        ensure_topics(bootstrap, [TopicSpec(name=topic, partitions=6)], replication=Replication())

    # A producer sends all the time while broker 2 is SIGKILLed, comes back, then broker 3 likewise.
    producer = reliable_producer(bootstrap, linger_ms=5, request_timeout_ms=10_000)
    sent: list[bytes] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        n = 0
        while not stop.is_set():
            value = f"m{n:06d}".encode()
            future = producer.send(topic, key=value[-2:], value=value)
            future.add_callback(lambda _meta, value=value: sent.append(value))
            future.add_errback(failures.append)
            n += 1
            time.sleep(0.002)

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    try:
        for broker in cluster.brokers[1:]:
            time.sleep(3)
            _kill(broker)
            time.sleep(5)  # writes go on with two in sync
            broker.start()
            assert wait_until(cluster.healthy, timeout_s=120, interval_s=0.5), f"{broker.name} did not come back"
            assert wait_until(lambda: under_replicated(bootstrap, [topic]) == 0, timeout_s=120, interval_s=1), (
                f"{broker.name} did not catch up"
            )
        time.sleep(2)
    finally:
        stop.set()
        sender.join(timeout=30)
        producer.flush(timeout=60)
        producer.close()
    assert failures == [], f"{len(failures)} sends failed, first: {failures[:1]}"
    assert len(sent) > 1000

    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap.split(","), auto_offset_reset="earliest", enable_auto_commit=False,
        consumer_timeout_ms=15_000,
    )  # fmt: skip
    try:
        received = [record.value for record in consumer]
    finally:
        consumer.close()
    assert len(received) == len(set(received)), "a record was written twice"
    assert set(received) == set(sent), f"{len(set(sent) - set(received))} acknowledged records were lost"
