"""Topic provisioning is idempotent, applies the configured retention and cleanup, and only ever grows."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from infra.errors import ProvisioningError
from infra.settings import TopicSpec, TopicsSettings
from infra.stack import Endpoints
from infra.topics import ensure_topics


def _describe(bootstrap: str, name: str) -> tuple[int, dict[str, str]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        partitions = len(admin.describe_topics([name])[0]["partitions"])
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)], config_filter="all")
    finally:
        admin.close()
    return partitions, {key: str(entry["value"]) for key, entry in configs["topic"][name].items()}


def test_provisioning_creates_checks_and_grows(endpoints: Endpoints) -> None:
    bootstrap = endpoints.kafka_bootstrap
    name = f"test.provision.{uuid.uuid4().hex[:8]}"
    spec = TopicSpec(name=name, partitions=2, retention_ms=3_600_000, cleanup_policy="compact,delete")
    assert ensure_topics(bootstrap, [spec]) == {name: "created"}
    assert ensure_topics(bootstrap, [spec]) == {name: "checked"}
    partitions, configs = _describe(bootstrap, name)
    assert partitions == 2
    assert configs["retention.ms"] == "3600000"
    assert configs["cleanup.policy"] == "compact,delete"

    grown = spec.model_copy(update={"partitions": 4, "retention_ms": 60_000})
    assert ensure_topics(bootstrap, [grown]) == {name: "grown"}
    partitions, configs = _describe(bootstrap, name)
    assert partitions == 4
    assert configs["retention.ms"] == "60000"

    with pytest.raises(ProvisioningError, match="cannot remove partitions"):
        ensure_topics(bootstrap, [spec])


def test_the_loop_topics_exist_after_up(endpoints: Endpoints) -> None:
    admin = KafkaAdminClient(bootstrap_servers=endpoints.kafka_bootstrap)
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    assert {spec.name for spec in TopicsSettings().all()} <= existing


def test_new_partitions_preallocate_small_indexes(endpoints: Endpoints) -> None:
    # The broker's default (10 MiB) costs a new partition tens of ms of zeroing (see infra.kafka_broker).
    name = f"test.indexes.{uuid.uuid4().hex[:8]}"
    ensure_topics(endpoints.kafka_bootstrap, [TopicSpec(name=name, partitions=1)])
    _, configs = _describe(endpoints.kafka_bootstrap, name)
    assert configs["segment.index.bytes"] == str(1 << 20)
