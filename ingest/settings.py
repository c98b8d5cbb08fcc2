"""Ingest's settings: the embedded SDK's, the HTTP ingest API's and the archiver's.

Light on purpose, like the SDK that imports it: pydantic, pydantic-settings, :mod:`infra.settings` and
the event contract's size limit, nothing else (no web framework, Kafka or database client).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from infra.settings import (
    KAFKA_BOOTSTRAP_DEFAULT,
    KafkaBootstrap,
    LiveloopSettings,
    Port,
    PostgresDsn,
    TopicName,
    TopicsSettings,
)
from ingest.events import MAX_EVENT_BYTES


class SdkSettings(LiveloopSettings):
    """The embedded SDK's settings. Env prefix ``LIVELOOP_SDK_``."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_SDK_")

    bootstrap: KafkaBootstrap = KAFKA_BOOTSTRAP_DEFAULT
    topic: TopicName = "liveloop.events"
    journal_dir: Path = Field(default=Path(".liveloop/sdk-journal"), description="One folder per client.")
    journal_max_bytes: int = Field(default=1 << 30, ge=1 << 20, description="Past this, emit raises BackPressure.")
    journal_segment_bytes: int = Field(default=64 << 20, ge=1 << 16)
    fsync_interval_s: float = Field(default=1.0, gt=0, description="How often the journal is fsync'ed.")
    compression: str | None = Field(default="gzip", description="Batch compression; gzip needs no extra package.")
    linger_ms: int = Field(default=5, ge=0, le=1000, description="How long a batch waits to fill.")
    max_in_flight: int = Field(default=20_000, ge=1, description="Events sent but not yet acknowledged, at most.")
    client_id: str = "liveloop-sdk"


class IngestSettings(LiveloopSettings):
    """Settings of the HTTP ingest API. Env prefix ``LIVELOOP_INGEST_``."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_INGEST_")

    host: str = Field(default="127.0.0.1", min_length=1, description="Address to listen on; loopback only by default.")
    port: Port = Field(default=8081, description="TCP port to listen on.")
    bootstrap: KafkaBootstrap = KAFKA_BOOTSTRAP_DEFAULT
    events_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().events.name, description="Where accepted events go."
    )
    dlq_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().events_dlq.name, description="Where rejections go."
    )
    credentials_path: Path = Field(
        default=Path(".liveloop/credentials.json"), description="Credential file (mode 0600) with the tenants' keys."
    )
    max_request_bytes: int = Field(
        default=8 << 20, ge=1 << 10, le=1 << 30, description="Largest request body; larger ones get 413 unread."
    )
    max_batch_items: int = Field(default=1000, ge=1, le=100_000, description="Most events in one batch (else 413).")
    max_message_bytes: int = Field(
        default=1 << 20,
        ge=64 << 10,
        le=MAX_EVENT_BYTES + (1 << 20),
        description="Largest Kafka record batch; must not exceed the topics' max.message.bytes (1 MiB by default). "
        "A larger event is rejected as too large.",
    )
    produce_timeout_s: float = Field(
        default=10.0, gt=0, le=300, description="How long to wait for Kafka's acknowledgement before answering 503."
    )
    retry_after_s: int = Field(default=5, ge=1, le=3600, description="Retry-After of a 503 answer, in seconds.")
    linger_ms: int = Field(default=5, ge=0, le=1000, description="How long a Kafka batch waits to fill.")
    compression: Literal["gzip", "none"] = Field(default="gzip", description="Kafka batch compression.")
    client_id: str = Field(default="liveloop-ingest-api", min_length=1, description="Kafka client id.")
    cpu_workers: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Processes that validate and redact large bodies beside the event loop; 0 does it inline. "
        "One per core left over by Kafka and the rest of the host.",
    )
    enable_discard_endpoint: bool = Field(
        default=False,
        description="Serve POST /bench/discard (authenticates, reads and drops the body): the benchmark's baseline.",
    )


class ArchiverSettings(LiveloopSettings):
    """The archiver's settings. Env prefix ``LIVELOOP_ARCHIVER_``."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_ARCHIVER_")

    bootstrap: KafkaBootstrap = KAFKA_BOOTSTRAP_DEFAULT
    dsn: PostgresDsn = Field(description="PostgreSQL DSN of the (migrated) audit store.")
    events_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().events.name, description="Topic of raw events."
    )
    dlq_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().events_dlq.name, description="Dead-letter topic."
    )
    group_id: str = Field(default="liveloop-archiver", min_length=1, max_length=255, description="Consumer group.")
    batch_max_records: int = Field(default=2000, ge=1, le=100_000, description="Most records in one transaction.")
    batch_max_wait_s: float = Field(default=0.5, gt=0, le=60, description="Longest a batch waits to fill, seconds.")
    session_timeout_s: float = Field(
        default=10.0, ge=6, le=1800, description="How long a crashed archiver holds its partitions before takeover."
    )
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description="Prometheus port; unset: not served.")
    metrics_host: str = Field(
        default="127.0.0.1", min_length=1, description="Address of the Prometheus endpoint; loopback by default."
    )
