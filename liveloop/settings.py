"""Settings of the liveloop command line's own commands (the stage services keep theirs in their packages).

``OperatorSettings`` (env prefix ``LIVELOOP_OPERATOR_``) tells ``liveloop promote/rollback/reject``
where the loop they act on is (:mod:`liveloop.serving_cli`). The simulator's settings live with it, in
:mod:`liveloop.demo.simulator.settings`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from infra.settings import KafkaBootstrap, LiveloopSettings, MlflowUrl, PostgresDsn, TopicName, TopicsSettings


class OperatorSettings(LiveloopSettings):
    """Where the operator commands act. Env prefix ``LIVELOOP_OPERATOR_``; unset addresses are the local stack's."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_OPERATOR_")

    key: SecretStr | None = Field(default=None, description="The operator key (or pass --key).")
    model_name: str = Field(default="liveloop-policy", min_length=1, description="The MLflow registered model.")
    credentials_path: Path | None = Field(default=None, description="Credential file; default: the local stack's.")
    dsn: PostgresDsn | None = Field(default=None, description="PostgreSQL audit store; default: the local stack's.")
    mlflow_url: MlflowUrl | None = Field(default=None, description="MLflow tracking URI; default: the local stack's.")
    bootstrap: KafkaBootstrap | None = Field(default=None, description="Kafka bootstrap; default: the local stack's.")
    promotions_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().promotions.name,
        description="Where decisions are announced.",
    )


class ReplicasSettings(LiveloopSettings):
    """How many processes of the stateless components ``liveloop up`` runs. Env prefix ``LIVELOOP_REPLICAS_``.

    Replica n (from 1) of a component listens on its stage's port + n - 1 (the gateway's
    ``LIVELOOP_SERVING_PORT``, the ingest API's ``LIVELOOP_INGEST_PORT``) and runs under its own keeper,
    which restarts it alone when it dies. Gateway replicas each follow the champion alias on their own
    (every one reads the whole promotions topic); put a load balancer in front of the ports, as a
    Kubernetes Service does in a cluster.
    """

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_REPLICAS_")

    gateway: int = Field(
        default=1, ge=1, le=8, description="Gateway processes (each holds the model: memory grows with each)."
    )
    ingest_api: int = Field(default=1, ge=1, le=8, description="Ingest API processes (stateless, one core each).")
