"""The distiller's settings. Env prefix ``LIVELOOP_DISTILL_``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from distill.sessions import ORPHAN_GRACE_S
from infra.settings import (
    KAFKA_BOOTSTRAP_DEFAULT,
    MAX_LOCAL_BROKERS,
    KafkaBootstrap,
    LiveloopSettings,
    PostgresDsn,
    Replication,
    TopicName,
)


class DistillSettings(LiveloopSettings):
    """Where the distiller reads, writes and keeps its state."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_DISTILL_")

    bootstrap: KafkaBootstrap = KAFKA_BOOTSTRAP_DEFAULT
    dsn: PostgresDsn = Field(description="PostgreSQL DSN of the audit store (samples, lineage, late feedback).")
    events_topic: TopicName = "liveloop.events"
    samples_topic: TopicName = "liveloop.samples"
    dlq_topic: TopicName = "liveloop.events.dlq"
    app_id: str = Field(default="liveloop-distill", description="Faust app id: consumer group and table names.")
    partitions: int = Field(default=6, ge=1, description="Must equal the events topic's partition count.")
    replication_factor: int = Field(
        default=1,
        ge=1,
        le=MAX_LOCAL_BROKERS,
        description="Replicas of the distiller's own topics (changelogs, ticks, scored): as the loop's topics "
        "(TopicsSettings), or a broker's loss would stop the worker.",
    )
    min_insync_replicas: int = Field(
        default=1, ge=1, le=MAX_LOCAL_BROKERS, description="min.insync.replicas of the distiller's own topics."
    )
    store: Literal["rocksdb", "memory"] = Field(
        default="rocksdb", description="Table store; 'memory' rebuilds tables from their changelogs at start."
    )
    data_dir: Path = Field(default=Path(".liveloop/distill"), description="Faust's local state (RocksDB).")
    web_port: int = Field(default=6066, ge=1, le=65535, description="/healthz and /metrics.")
    web_host: str = "127.0.0.1"
    batch_max_events: int = Field(
        default=1000, ge=1, le=100_000, description="Most records an agent takes from its stream at once."
    )
    # 40 ms, not 10: records reach an agent's buffer on the agent's own event loop, so they pile up only
    # while it waits, and under load this wait sets the batch size. At 10 ms a batch held about twenty
    # events, and the per-batch work (changelog and audit-store writes, the scored records) cost about 8 %
    # more CPU per event (interleaved drains of 6,000 events, measured); a sample's two hops wait at most
    # 80 ms.
    batch_max_wait_s: float = Field(
        default=0.04, gt=0, le=5, description="Longest an agent waits to fill a batch (adds to sample latency)."
    )
    # 20 ms, not less: each produce request wakes the broker, and at 5 ms those requests cost the
    # distiller about a tenth of its throughput (measured); a sample's two hops add at most 40 ms.
    producer_linger_s: float = Field(
        default=0.02, ge=0, le=1, description="How long the producer holds records to send them together."
    )
    fetch_max_wait_s: float = Field(
        default=0.05, gt=0, le=1.5, description="Longest the broker holds a fetch of the app's consumer for new data."
    )
    tick_interval_s: float = Field(default=1.0, gt=0, le=60, description="How often closed windows are finalised.")
    orphan_grace_s: float = Field(
        default=ORPHAN_GRACE_S,
        ge=0,
        le=3600,
        description="How long after an ended session's last event its feedback for unseen generations waits for "
        "them before it is dead-lettered (distill.sessions).",
    )
    audit_retry_s: float = Field(
        default=300.0,
        gt=0,
        description="How long a write to PostgreSQL waits for an unreachable database before the distiller crashes.",
    )
    spec_path: Path | None = Field(default=None, description="Reward spec YAML; the packaged default if unset.")
    tokenizer: str | None = Field(default=None, description="The served model's tokenizer, named in each sample.")

    @property
    def replication(self) -> Replication:
        """The replication of the distiller's own topics (min ISR never above the replicas)."""
        return Replication(
            factor=self.replication_factor, min_insync=min(self.min_insync_replicas, self.replication_factor)
        )
