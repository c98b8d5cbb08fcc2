"""The one way the loop's small kafka-python producers are made: ``acks=all`` and idempotent.

On a replicated cluster (``min.insync.replicas=2`` of 3) ``acks=all`` means a write is acknowledged only
once two brokers have it, so losing one broker loses no acknowledged record; idempotence means a send
retried after a lost acknowledgement (a broker killed between writing and answering) is not written
twice. The high-volume producers (the ingest SDK and API, the distiller's Faust producer) set the same
two options among their own tuning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kafka import KafkaProducer

RELIABLE_OPTIONS: dict[str, Any] = {"acks": "all", "enable_idempotence": True}
"""What every producer of the loop sets, whatever else it tunes."""


def reliable_producer(bootstrap: str, **options: Any) -> KafkaProducer:
    """A kafka-python producer to ``bootstrap`` (comma-separated brokers) with :data:`RELIABLE_OPTIONS`."""
    from kafka import KafkaProducer

    # Retries stay at the client's default (unbounded, within delivery_timeout_ms of 2 minutes): a broker killed
    # while leading is fenced only after the controller's session timeout (9 s), and a bounded count of retries
    # 100 ms apart ran out before that, failing thousands of sends with NotLeaderForPartitionError.
    return KafkaProducer(bootstrap_servers=bootstrap.split(","), **{**options, **RELIABLE_OPTIONS})
