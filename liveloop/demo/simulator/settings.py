"""The simulator's settings: one class, ``SimulatorSettings``, env prefix ``LIVELOOP_SIMULATOR_``.

Times are real seconds: the demo compresses "minutes later" (an edit checked after a while) into seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from infra.settings import KAFKA_BOOTSTRAP_DEFAULT, KafkaBootstrap, LiveloopSettings, TopicName, TopicsSettings
from liveloop.demo.simulator.profiles import PROFILES

_IDENTIFIER = r"^[a-z][a-z0-9_.-]{0,63}$"


class SimulatorSettings(LiveloopSettings):
    """Settings of the traffic simulator (``liveloop simulate``). Env prefix ``LIVELOOP_SIMULATOR_``."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_SIMULATOR_")

    # -- where traffic goes -----------------------------------------------------------------------
    gateway_url: str = Field(
        default="http://127.0.0.1:8000/v1", pattern=r"^https?://", description="Base URL of the gateway's /v1 API."
    )
    gateway_key: SecretStr | None = Field(
        default=None, description="Bearer key of the gateway; unset, the credential file's gateway_key."
    )
    credentials_path: Path = Field(
        default=Path(".liveloop/credentials.json"), description="Credential file with the gateway and ingest keys."
    )
    model: str = Field(default="liveloop-policy", min_length=1, description="Model name sent in every request.")
    ingest_url: str | None = Field(
        default="http://127.0.0.1:8081",
        pattern=r"^https?://",
        description="Ingest HTTP API that malformed events are sent to (expecting the DLQ); None skips them.",
    )
    bootstrap: KafkaBootstrap = Field(
        default=KAFKA_BOOTSTRAP_DEFAULT,
        description="Kafka bootstrap of the ingest SDK that sends the feedback events.",
    )
    events_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().events.name, description="The events topic."
    )
    sdk_journal_dir: Path = Field(
        default=Path(".liveloop/simulator-journal"), description="The ingest SDK's on-disk journal of the simulator."
    )
    tenant: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", description="Tenant of all events.")
    surface: str = Field(default="ide.tab", pattern=_IDENTIFIER, description="Product surface of the sessions.")

    # -- who the users are ------------------------------------------------------------------------
    scenario: Literal["code", "swarm", "summary", "prune"] = Field(
        default="code",
        description="What sessions do: 'code', completions judged by users with hidden preferences (profile, "
        "profile_mix); 'swarm', an orchestrator's trajectories (liveloop.demo.simulator.swarm); 'summary', sessions "
        "longer than the context that the model summarises (liveloop.demo.simulator.summaries); 'prune', multi-hop "
        "lookups under a context budget (liveloop.demo.simulator.pruning).",
    )
    profile: str = Field(default="semicolons", description="The profile of every session, unless profile_mix is set.")
    profile_mix: dict[str, float] | None = Field(
        default=None, description="Profile name -> weight; sessions draw their profile from it (overrides profile)."
    )
    users_per_profile: int = Field(
        default=200, ge=1, le=100_000, description="Distinct user ids per profile (the distiller caps per user)."
    )
    fickle_period_s: float = Field(
        default=180.0, gt=0, description="The fickle profile's preference flips every this many seconds of run time."
    )

    # -- how much traffic -------------------------------------------------------------------------
    seed: int = Field(default=0, ge=0, description="Run seed; every session draws from its own RNG derived from it.")
    minutes: float = Field(default=10.0, gt=0, le=7 * 24 * 60, description="How long new sessions keep starting.")
    session_rate: float = Field(default=1.0, gt=0, le=1000, description="Sessions started per second (Poisson).")
    max_sessions: int | None = Field(default=None, ge=1, description="Stop starting sessions after this many.")
    concurrency: int = Field(default=16, ge=1, le=1024, description="Sessions running at once (threads), at most.")
    min_requests: int = Field(default=3, ge=1, le=1000, description="Fewest completion requests in a session.")
    max_requests: int = Field(default=8, ge=1, le=1000, description="Most completion requests in a session.")
    think_s: float = Field(default=0.3, ge=0, le=600, description="Mean time a user looks at a completion.")
    gap_s: float = Field(default=0.5, ge=0, le=600, description="Mean time between a reaction and the next request.")
    edit_check_delay_s: float = Field(
        default=3.0, ge=0, le=3600, description="When an accepted edit is checked (persisted or reverted), compressed."
    )
    drain_s: float = Field(default=60.0, ge=0, description="How long running sessions may take to finish at the end.")

    # -- the requests -----------------------------------------------------------------------------
    max_tokens: int = Field(default=16, ge=1, le=1024, description="max_tokens of every completion request.")
    temperature: float = Field(default=1.0, ge=0, le=2, description="Sampling temperature of every request.")
    request_timeout_s: float = Field(default=30.0, gt=0, description="Timeout of one gateway request.")
    ready_timeout_s: float = Field(default=120.0, ge=0, description="How long to wait for the gateway to be ready.")

    # -- what production also has ----------------------------------------------------------------
    privacy_share: float = Field(default=0.05, ge=0, le=1, description="Share of sessions in privacy mode.")
    secret_share: float = Field(default=0.05, ge=0, le=1, description="Share of sessions that paste a secret.")
    malformed_share: float = Field(
        default=0.03, ge=0, le=1, description="Share of sessions whose product also sends one malformed event."
    )

    # -- the summary ------------------------------------------------------------------------------
    bucket_s: float = Field(default=30.0, gt=0, description="Width of the summary's timeline buckets.")
    summary_path: Path | None = Field(default=None, description="Write the run's summary here as JSON.")

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, name: str) -> str:
        if name not in PROFILES:
            raise ValueError(f"unknown profile {name!r}; use one of {', '.join(PROFILES)}")
        return name

    @field_validator("profile_mix")
    @classmethod
    def _known_mix(cls, mix: dict[str, float] | None) -> dict[str, float] | None:
        if mix is None:
            return None
        unknown = sorted(set(mix) - set(PROFILES))
        if unknown:
            raise ValueError(f"unknown profiles {unknown} in profile_mix; use names from {', '.join(PROFILES)}")
        if any(weight < 0 for weight in mix.values()) or not sum(mix.values()) > 0:
            raise ValueError(f"profile_mix {mix} needs non-negative weights with a positive sum")
        return mix

    @model_validator(mode="after")
    def _request_range(self) -> SimulatorSettings:
        if self.min_requests > self.max_requests:
            raise ValueError(f"min_requests {self.min_requests} is above max_requests {self.max_requests}")
        return self

    def mix(self) -> dict[str, float]:
        """The profile mix in effect: ``profile_mix``, or all sessions of ``profile``."""
        return dict(self.profile_mix) if self.profile_mix else {self.profile: 1.0}
