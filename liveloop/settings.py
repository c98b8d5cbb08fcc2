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
