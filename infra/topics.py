"""Topic provisioning: create the loop's topics, or bring existing ones in line with their settings.

Idempotent: run it on every ``up``. Partitions can grow but never shrink (Kafka cannot), so a topic
with more partitions than configured is reported, not changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError, TopicAlreadyExistsError

from infra.errors import ProvisioningError, ServiceUnavailable
from infra.settings import Replication, TopicSpec


def _configs(spec: TopicSpec, replication: Replication) -> dict[str, str]:
    return {
        "retention.ms": str(spec.retention_ms),
        "cleanup.policy": spec.cleanup_policy,
        "min.insync.replicas": str(replication.min_insync),
    }


def ensure_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec],
    timeout_ms: int = 30_000,
    replication: Replication | None = None,
) -> dict[str, str]:
    """Make each topic exist as its spec says, with ``replication`` (default: one replica); return what was done
    per topic (created/grown/checked).

    A topic that exists with another number of replicas is refused (ProvisioningError): changing it is a
    partition reassignment, an operator's decision, not something to do on every ``up``."""
    specs = list(specs)
    replication = replication or Replication()
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms, client_id="liveloop-provision"
        )
    except KafkaError as exc:
        raise ServiceUnavailable(f"cannot reach Kafka at {bootstrap} to provision topics: {exc}") from exc
    try:
        return _ensure(admin, specs, timeout_ms, replication)
    except KafkaError as exc:
        raise ProvisioningError(f"provisioning topics on {bootstrap} failed: {exc!r}") from exc
    finally:
        admin.close()


def _ensure(
    admin: KafkaAdminClient, specs: list[TopicSpec], timeout_ms: int, replication: Replication
) -> dict[str, str]:
    existing = set(admin.list_topics())
    actions: dict[str, str] = {}
    missing = {
        s.name: {
            "num_partitions": s.partitions,
            "replication_factor": replication.factor,
            "configs": _configs(s, replication),
        }
        for s in specs
        if s.name not in existing
    }
    if missing:
        # Created concurrently by another `up`? Then it is checked like any existing topic next time.
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics(missing, timeout_ms=timeout_ms, wait_for_metadata=True)
        actions.update({name: "created" for name in missing})

    present = [s for s in specs if s.name not in missing]
    if not present:
        return actions
    described = admin.describe_topics([s.name for s in present])
    partitions = {t["name"]: len(t["partitions"]) for t in described}
    replicas = {t["name"]: {len(p["replica_nodes"]) for p in t["partitions"]} for t in described}
    differ = [f"{name} has {sorted(counts)}" for name, counts in replicas.items() if counts != {replication.factor}]
    if differ:
        raise ProvisioningError(
            f"topics exist with another number of replicas than {replication.factor}: "
            + "; ".join(differ)
            + ". Reassign their partitions (kafka-reassign-partitions) or set the replication factor to match."
        )
    grow = {s.name: s.partitions for s in present if partitions[s.name] < s.partitions}
    shrink = [
        f"{s.name} has {partitions[s.name]} > {s.partitions}" for s in present if partitions[s.name] > s.partitions
    ]
    if shrink:
        raise ProvisioningError(
            "Kafka cannot remove partitions: " + "; ".join(shrink) + ". Raise the setting or recreate the topic."
        )
    if grow:
        admin.create_partitions(grow, timeout_ms=timeout_ms)
    resources = [ConfigResource(ConfigResourceType.TOPIC, s.name, configs=_configs(s, replication)) for s in present]
    admin.alter_configs(resources)
    for s in present:
        actions[s.name] = "grown" if s.name in grow else "checked"
    return actions
