"""Settings: one pydantic-settings base that every stage extends with its own env prefix.

Each service has exactly one settings class, named ``<Stage>Settings``, whose env prefix is
``LIVELOOP_<STAGE>_``. Settings are validated when the service starts and every problem is reported
at once (pydantic collects all errors of a model before it raises).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The field types that several stages' settings share: each declared once, with its one validation,
# so that a typo in any stage's env is refused at start-up with the same message naming the value.

Port = Annotated[int, Field(ge=1, le=65535)]

KAFKA_BOOTSTRAP_DEFAULT = "127.0.0.1:9092"
"""The local stack's broker (``StackSettings``' host and kafka_port): every stage's default bootstrap."""

MLFLOW_URL_DEFAULT = "http://127.0.0.1:5000"
"""The local stack's MLflow server (``StackSettings``' host and mlflow_port)."""

# A host name or IPv4 address, or an IPv6 address in brackets; then the port.
_HOST_PORT = re.compile(r"(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(\d+)")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def _kafka_bootstrap(value: str) -> str:
    for address in value.split(","):
        match = _HOST_PORT.fullmatch(address)
        if match is None or not 1 <= int(match.group(1)) <= 65535:
            raise ValueError(
                f"Kafka bootstrap {value!r} is not a comma-separated list of host:port (port 1-65535), "
                f"e.g. {KAFKA_BOOTSTRAP_DEFAULT!r} or 'kafka-1:9092,kafka-2:9092'"
            )
    return value


def _topic_name(value: str) -> str:
    # Kafka's own rule (kafka.common.internals.Topic): these characters, 1 to 249 of them, not '.' or '..'.
    if _TOPIC_NAME.fullmatch(value) is None or value in (".", ".."):
        raise ValueError(
            f"topic name {value!r} is not a legal Kafka topic name: 1 to 249 of the characters "
            "A-Z a-z 0-9 . _ -, and not '.' or '..'"
        )
    return value


def _uri(value: str) -> str:
    if _URI.fullmatch(value) is None:
        raise ValueError(f"MLflow tracking URI {value!r} is not a URI with a scheme, e.g. {MLFLOW_URL_DEFAULT!r}")
    return value


KafkaBootstrap = Annotated[
    str,
    AfterValidator(_kafka_bootstrap),
    Field(description="Kafka bootstrap servers: a comma-separated list of host:port."),
]
TopicName = Annotated[
    str,
    AfterValidator(_topic_name),
    Field(description="A Kafka topic name: 1 to 249 of A-Z a-z 0-9 . _ -, not '.' or '..'."),
]
PostgresDsn = Annotated[
    SecretStr,
    Field(min_length=1, description="PostgreSQL DSN (a secret, never logged): a postgresql:// URI or key=value pairs."),
]
MlflowUrl = Annotated[
    str,
    AfterValidator(_uri),
    Field(description="MLflow tracking/registry URI, e.g. http://host:5000."),
]


class LiveloopSettings(BaseSettings):
    """Base of every stage's settings: env-driven, strict about unknown keys, validated eagerly."""

    model_config = SettingsConfigDict(
        env_prefix="LIVELOOP_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )


MAX_LOCAL_BROKERS = 5
"""The most brokers a local stack runs (and the most replicas a topic's setting may ask for)."""


class TopicSpec(BaseModel):
    """How one Kafka topic is provisioned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TopicName
    partitions: int = Field(default=6, ge=1, le=1024, description="Partitions; may grow, never shrink.")
    retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=-1, description="-1 keeps data forever.")
    cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete"


class TopicsSettings(LiveloopSettings):
    """The topics of the loop (DESIGN.md, 'Topics'). Override e.g. LIVELOOP_TOPICS_EVENTS__PARTITIONS=12."""

    # A partial update: LIVELOOP_TOPICS_EVENTS__PARTITIONS alone changes the events topic's partitions and keeps
    # its name and retention (without it, the one key would replace the whole default TopicSpec and be refused).
    model_config = SettingsConfigDict(env_prefix="LIVELOOP_TOPICS_", nested_model_default_partial_update=True)

    events: TopicSpec = TopicSpec(name="liveloop.events", partitions=6)
    events_dlq: TopicSpec = TopicSpec(name="liveloop.events.dlq", partitions=1, retention_ms=30 * 24 * 3600 * 1000)
    samples: TopicSpec = TopicSpec(name="liveloop.samples", partitions=3, retention_ms=30 * 24 * 3600 * 1000)
    # Announcements and decisions are small and must outlive any retention window: keep them.
    checkpoints: TopicSpec = TopicSpec(name="liveloop.checkpoints", partitions=1, retention_ms=-1)
    promotions: TopicSpec = TopicSpec(name="liveloop.promotions", partitions=1, retention_ms=-1)

    replication_factor: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LOCAL_BROKERS,
        description="Replicas of every topic's partitions; unset: as many as the local stack's brokers, at most 3 "
        "(with an external Kafka, set it to what the cluster holds, e.g. 3).",
    )
    min_insync_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LOCAL_BROKERS,
        description="Replicas that must have a write before an acks=all producer is told it succeeded; unset: 2 "
        "with three or more replicas (one broker may fail without losing an acknowledged write), else 1.",
    )

    @model_validator(mode="after")
    def _isr_within_replicas(self) -> TopicsSettings:
        if self.replication_factor and self.min_insync_replicas and self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas {self.min_insync_replicas} exceeds replication_factor "
                f"{self.replication_factor}: no write could ever be acknowledged"
            )
        return self

    def replication(self, brokers: int) -> Replication:
        """The replication of every topic on a cluster of ``brokers`` brokers (this setting, or its default)."""
        factor = self.replication_factor or min(brokers, 3)
        if factor > brokers:
            raise ValueError(f"replication_factor {factor} needs at least {factor} brokers, the cluster has {brokers}")
        isr = self.min_insync_replicas or (2 if factor >= 3 else 1)
        return Replication(factor=factor, min_insync=min(isr, factor))

    def all(self) -> list[TopicSpec]:
        """Every topic, in the order of the loop."""
        return [self.events, self.events_dlq, self.samples, self.checkpoints, self.promotions]


class Replication(BaseModel):
    """How many copies each partition has, and how many must hold a write before it is acknowledged."""

    model_config = ConfigDict(frozen=True)

    factor: int = Field(default=1, ge=1, description="Replicas of each partition.")
    min_insync: int = Field(default=1, ge=1, description="min.insync.replicas: replicas an acks=all write needs.")


class StackSettings(LiveloopSettings):
    """Where the local stack lives and listens. Env prefix ``LIVELOOP_INFRA_``.

    Each service is either started locally (the default) or, when its external address is set,
    used as it is and never started or stopped by liveloop.
    """

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_INFRA_")

    state_dir: Path = Field(default=Path(".liveloop"), description="Local state: data, logs, pids, credentials.")
    cache_dir: Path = Field(
        default=Path.home() / ".cache" / "liveloop",
        description="Downloaded artifacts (the Kafka jars), kept outside the work tree and reused.",
    )
    host: str = Field(default="127.0.0.1", description="Address every local service binds to.")
    startup_timeout_s: float = Field(default=90.0, gt=0, le=600, description="How long the services may take to start.")
    component_startup_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=1800,
        description="How long the loop's components may take to answer their health checks once started "
        "(the learner and the gateway import torch and DeepSpeed, slow on a busy 2-core machine).",
    )

    kafka_bootstrap: KafkaBootstrap | None = Field(
        default=None, description="External broker; when set none is started."
    )
    kafka_version: str = Field(default="4.3.1", pattern=r"^4\.\d+\.\d+$")
    kafka_port: Port = 9092
    kafka_controller_port: Port = 9093
    kafka_heap_opts: str = Field(default="-Xms256m -Xmx1g", description="JVM heap for the broker (2-core boxes).")
    kafka_brokers: int = Field(
        default=1,
        ge=1,
        le=MAX_LOCAL_BROKERS,
        description="Brokers of the local Kafka cluster (KRaft, each broker also a controller). Broker n (from 1) "
        "listens on kafka_port + 2(n-1) and its controller on kafka_controller_port + 2(n-1), so the defaults "
        "9092/9093 give 9094/9095 and 9096/9097 to brokers 2 and 3. Three give a quorum that survives one loss.",
    )

    postgres_dsn: PostgresDsn | None = Field(default=None, description="External PostgreSQL; when set none is started.")
    postgres_port: Port = 5433
    postgres_bin_dir: Path | None = Field(default=None, description="PostgreSQL server binaries; found if unset.")

    mlflow_url: MlflowUrl | None = Field(default=None, description="External MLflow server; when set none is started.")
    mlflow_port: Port = 5000

    @model_validator(mode="after")
    def _broker_ports_distinct(self) -> StackSettings:
        ports = [port for node in range(1, self.kafka_brokers + 1) for port in self.kafka_node_ports(node)]
        if max(ports) > 65535 or len(set(ports)) != len(ports):
            raise ValueError(
                f"{self.kafka_brokers} brokers from kafka_port {self.kafka_port} and kafka_controller_port "
                f"{self.kafka_controller_port} (each + 2 per broker) need distinct ports up to 65535, got {ports}"
            )
        return self

    def kafka_node_ports(self, node: int) -> tuple[int, int]:
        """Broker ``node``'s (from 1) client and controller ports."""
        step = 2 * (node - 1)
        return self.kafka_port + step, self.kafka_controller_port + step

    @property
    def kafka_address(self) -> str:
        """The bootstrap address clients use (every local broker, so that any one of them may be down)."""
        if self.kafka_bootstrap:
            return self.kafka_bootstrap
        nodes = range(1, self.kafka_brokers + 1)
        return ",".join(f"{self.host}:{self.kafka_node_ports(node)[0]}" for node in nodes)

    @property
    def mlflow_address(self) -> str:
        """The tracking URI clients use."""
        return self.mlflow_url or f"http://{self.host}:{self.mlflow_port}"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def run_dir(self) -> Path:
        """Pid files of the processes this stack started."""
        return self.state_dir / "run"

    @property
    def credentials_path(self) -> Path:
        return self.state_dir / "credentials.json"
