"""``DashboardSettings`` (env prefix ``LIVELOOP_DASHBOARD_``): where the dashboard listens and what it reads."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from infra.settings import (
    KAFKA_BOOTSTRAP_DEFAULT,
    MLFLOW_URL_DEFAULT,
    KafkaBootstrap,
    LiveloopSettings,
    MlflowUrl,
    Port,
    PostgresDsn,
    TopicName,
    TopicsSettings,
)

DEFAULT_PORT = 8090


class ComponentProbe(BaseModel):
    """One component of the loop as the overview shows it (``liveloop up`` fills these from its specs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_-]*$", description="As `status` names it.")
    health_url: str | None = Field(default=None, pattern=r"^https?://", description="Answers 2xx when healthy.")
    status_url: str | None = Field(default=None, pattern=r"^https?://", description="A JSON status document.")
    lag_group: str | None = Field(default=None, min_length=1, description="Its Kafka consumer group, for its lag.")
    lag_topics: list[str] = Field(default_factory=list, max_length=16, description="The topics that group reads.")
    keeper_state: Path | None = Field(default=None, description="Its keeper's state file, for its restart count.")


class DashboardSettings(LiveloopSettings):
    """Settings of the ops dashboard. Env prefix ``LIVELOOP_DASHBOARD_``; unset addresses are the local stack's."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_DASHBOARD_")

    host: str = Field(default="127.0.0.1", min_length=1, description="Address to listen on; loopback by default.")
    port: Port = Field(default=DEFAULT_PORT, description="TCP port of the dashboard.")
    credentials_path: Path = Field(
        default=Path(".liveloop/credentials.json"),
        description="Credential file (mode 0600): its operator_key signs in to act, its viewer_key to look.",
    )
    model_name: str = Field(default="liveloop-policy", min_length=1, max_length=256, description="The MLflow model.")
    dsn: PostgresDsn | None = Field(default=None, description="PostgreSQL audit store; default: the local stack's.")
    mlflow_url: MlflowUrl = Field(default=MLFLOW_URL_DEFAULT, description="MLflow tracking URI.")
    bootstrap: KafkaBootstrap = Field(
        default=KAFKA_BOOTSTRAP_DEFAULT, description="Kafka bootstrap: decisions are announced there; lag is read."
    )
    promotions_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().promotions.name, description="Where decisions are announced."
    )
    session_max_age_s: int = Field(
        default=12 * 3600, ge=60, le=7 * 24 * 3600, description="A sign-in lasts this long (one working day)."
    )
    session_secret: SecretStr | None = Field(
        default=None,
        min_length=32,
        description="Key that signs session cookies; unset: a random one per process (a restart signs everyone out).",
    )
    refresh_s: float = Field(
        default=2.0,
        ge=0.5,
        le=60,
        description=(
            "Seconds between background reads of MLflow's aliases, the components and Kafka's lag; pages show the "
            "latest read and its age, and an action re-reads at once (the overview page polls every 2 s)."
        ),
    )
    history_page_size: int = Field(default=100, ge=10, le=1000, description="Rows per page of the history.")
    components: list[ComponentProbe] = Field(
        default_factory=list, max_length=32, description="The loop's components for the overview (JSON list)."
    )


def sign_in_hint(credentials_path: Path) -> str:
    """One line for ``up`` and ``demo --keep-running``: where the dashboard answers and which key signs in."""
    settings = DashboardSettings()
    return (
        f"ops dashboard: http://{settings.host}:{settings.port}/ ; sign in with operator_key (to act) or "
        f"viewer_key (to look) from {credentials_path}"
    )
