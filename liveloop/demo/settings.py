"""``liveloop demo``'s settings beyond its options: one class, ``DemoSettings``, env prefix ``LIVELOOP_DEMO_``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from infra.settings import LiveloopSettings
from liveloop.demo.held_out import HELD_OUT_TASKS


class DemoSettings(LiveloopSettings):
    """Settings of ``liveloop demo`` beyond its options. Env prefix ``LIVELOOP_DEMO_``."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_DEMO_")

    base_cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "liveloop" / "base-models",
        description="Where pre-trained bases are kept between demos, one folder per scenario and recipe.",
    )
    base_cache: bool = Field(default=True, description="False: always pre-train, and cache nothing.")
    pretrain_steps: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Pre-training steps instead of the scenario's (a short test; a different key in the cache).",
    )
    held_out_tasks: int = Field(
        default=HELD_OUT_TASKS,
        ge=2,
        le=10_000,
        description="Fixed tasks the base and the judged checkpoint each answer for an agent scenario's verdict "
        "(liveloop/demo/held_out.py, whose HELD_OUT_TASKS says what the default measures and costs).",
    )
