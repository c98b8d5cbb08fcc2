"""The learner's settings. Env prefix ``LIVELOOP_LEARNER_``.

One class configures the long-running learner (:mod:`learner.service`): where it reads samples, where
it publishes checkpoints, how it trains (DeepSpeed ZeRO stage, full weights or LoRA, the loss), how often
it checkpoints, and where it keeps its state. Every field is validated when the service starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from infra.settings import KAFKA_BOOTSTRAP_DEFAULT, KafkaBootstrap, LiveloopSettings, MlflowUrl, PostgresDsn, TopicName
from learner.shaping import ANNEAL_STEPS_MAX, LAMBDA_MAX, ShapingSchedule

LossWeighting = Literal["token", "unit"]
"""How the samples of an optimiser step weigh in its loss (:attr:`LearnerSettings.loss_weighting`)."""

PausePoint = Literal["none", "mid_round", "mid_checkpoint", "mid_rebase"]
"""Where a test can freeze the learner to SIGKILL it (see :attr:`LearnerSettings.pause_at`)."""


class LearnerSettings(LiveloopSettings):
    """Everything the continuous learner needs; the DSN is a secret and never logged."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_LEARNER_")

    # -- where data comes from and goes to ------------------------------------------------------
    bootstrap: KafkaBootstrap = KAFKA_BOOTSTRAP_DEFAULT
    samples_topic: TopicName = Field(default="liveloop.samples", description="Reward samples to train on.")
    checkpoints_topic: TopicName = Field(
        default="liveloop.checkpoints", description="Where checkpoint announcements go."
    )
    consumer_group: str = Field(
        default="liveloop-learner",
        min_length=1,
        description="Group the learner commits its positions under after each round, for lag reporting only; "
        "positions always come from the last checkpoint manifest and the journal.",
    )
    dsn: PostgresDsn | None = Field(
        default=None, description="PostgreSQL DSN of the audit store; unset = checkpoints are written, not published."
    )
    mlflow_uri: MlflowUrl | None = Field(
        default=None, description="MLflow tracking URI; unset = checkpoints are written, not published."
    )

    # -- the model ---------------------------------------------------------------------------
    model_name: str = Field(
        default="liveloop-policy",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$",
        description="MLflow registered model name; checkpoint ids are '<model_name>-v<policy_version:05d>'.",
    )
    base_model: str = Field(
        default="tiny",
        min_length=1,
        description="A local Hugging Face model folder, or 'tiny' for learner.tiny_model's default tiny Llama.",
    )
    data_dir: Path = Field(
        default=Path(".liveloop/learner"),
        description="Round journal, private training state, checkpoint folders and publish markers.",
    )

    # -- cadence -------------------------------------------------------------------------------
    checkpoint_interval_s: float = Field(
        default=18_000.0, ge=0, description="A checkpoint is due this long after the previous one (default 5 h)."
    )
    min_samples: int = Field(default=1, ge=1, description="A due checkpoint waits until this many samples trained.")
    round_samples: int = Field(
        default=64, ge=1, description="Train a round once this many samples are buffered (or a checkpoint is due)."
    )
    token_budget: int = Field(
        default=4096, ge=1, description="Most prompt+completion tokens per optimizer step (one packed batch)."
    )
    max_staleness: int = Field(
        default=4, ge=0, description="Drop samples generated more than this many policy versions before ours."
    )
    # The held-out share is not a learner setting: it is the deployment's one LIVELOOP_HELD_OUT_PERCENT
    # (distill.samples.HeldOutSettings), shared with the gate.

    # -- the loss -----------------------------------------------------------------------------
    is_cap: float = Field(default=2.0, gt=0, description="c in the truncated importance weight min(pi/mu, c).")
    clip_eps: float | None = Field(default=None, gt=0, lt=1, description="PPO-style ratio clipping; None = off.")
    # More than one pass learns more from each sample, as PPO does: live samples are slow to come (a 12-minute agent
    # demo trains about ten rounds), and the clip keeps each pass near the policy that answered.
    epochs: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Passes over each round's batches, each pass its own optimiser steps (above 1, set clip_eps).",
    )
    # 0 by default: the learner rebases onto the champion after a rejection (learner.lineage), so a candidate is
    # one cycle of training from the champion rather than a drifting line, and a penalty would cost a second
    # copy of the weights and a second forward pass per step. Raise it for long cycles that near the gate's
    # KL limit (1.0 nats): the penalty pulls towards exactly the model the gate measures against.
    kl_coef: float = Field(
        default=0.0,
        ge=0,
        description="KL penalty weight to the reference, the champion when the cycle started (the checkpoint it "
        "rebased onto, or the champion read before the last checkpoint; without a registry, the learner's last "
        "checkpoint); 0 = off.",
    )
    baseline_decay: float = Field(default=0.9, ge=0, lt=1, description="Decay of the per-bucket reward EMA.")
    # A tiny policy's long answers (an orchestrator's 300-byte run of tool calls) garble when failures are pushed
    # down: the probability taken from a nearly right answer spreads over wrong bytes. Clamped at 0, only answers
    # better than their bucket's baseline train, each by how much better (filtered, reward-weighted imitation, as
    # in ReST and RAFT); docs/swarm-learnability.md has the figures.
    min_advantage: float | None = Field(
        default=None,
        le=0,
        description="Floor of each normalised advantage (0: samples below the baseline do not train); None = off.",
    )
    # With "token", every policy token of a step weighs the same, so a long answer outvotes a short one: an agent's
    # decision is one token of a 20-token answer and of a 280-token one alike, and the long answer's boilerplate
    # takes most of the step (docs/swarm-learnability.md).
    loss_weighting: LossWeighting = Field(
        default="token",
        description="How the samples of an optimiser step weigh in its loss: every policy token the same "
        "('token'), or every unit the same whatever its length ('unit': a trajectory, or a single-turn sample).",
    )

    # -- agent trajectories (learner.shaping, learner.trajectories) --------------------------------
    # PARL's shaping terms get an orchestrator to spawn sub-agents (and have them finish) early on; annealed
    # to 0 so that the policy ends up optimising the performance the gate judges, and nothing else.
    lambda_parallel: float = Field(
        default=0.2,
        ge=0,
        le=LAMBDA_MAX,
        description="Start value of the coefficient of an agent sample's r_parallel (anti serial collapse), "
        "falling linearly to 0 over lambda_anneal_steps.",
    )
    lambda_finish: float = Field(
        default=0.2,
        ge=0,
        le=LAMBDA_MAX,
        description="Start value of the coefficient of an agent sample's r_finish (anti fake parallelism), "
        "falling linearly to 0 over lambda_anneal_steps.",
    )
    lambda_anneal_steps: int = Field(
        default=2000,
        ge=0,
        le=ANNEAL_STEPS_MAX,
        description="Optimiser steps of the lineage over which both shaping coefficients fall to 0; 0 = no shaping.",
    )
    trajectory_wait_rounds: int = Field(
        default=8,
        ge=0,
        le=1000,
        description="Rounds a trajectory's samples wait for its other turns before they train as they are "
        "(counted as incomplete); 0 = never wait.",
    )

    # -- the optimizer and engine ----------------------------------------------------------------
    lr: float = Field(default=1e-5, gt=0, le=1, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="AdamW weight decay.")
    zero_stage: int = Field(
        default=2, ge=1, le=2, description="DeepSpeed ZeRO stage: 1 shards the optimizer, 2 also gradients."
    )
    lora: bool = Field(default=False, description="Train a LoRA adapter (peft) instead of the full weights.")
    lora_r: int = Field(default=8, ge=1, le=1024, description="LoRA rank.")
    lora_alpha: int = Field(default=16, ge=1, description="LoRA alpha (scale = alpha / r).")
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Module names LoRA adapts.",
    )
    seed: int = Field(default=0, ge=0, description="Seeds LoRA init and every optimizer step (from seed and step).")
    world_size: int = Field(default=1, ge=1, description="Processes (ranks) of the DeepSpeed job.")
    threads: int | None = Field(
        default=None, ge=1, description="torch intra-op threads per rank; unset = torch's default."
    )

    # -- operations ----------------------------------------------------------------------------
    status_host: str = Field(default="127.0.0.1", description="Address of the /status, /healthz, /metrics server.")
    status_port: int = Field(default=6070, ge=0, le=65535, description="Its port (0 = pick a free one).")
    poll_timeout_ms: int = Field(default=500, ge=10, le=60_000, description="How long one Kafka poll waits.")
    champion_poll_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Read the registry's champion alias at most this often at round boundaries, to rebase onto "
        "it when the learner's line was rejected or left (always read before a checkpoint); 0 = every round.",
    )
    pause_at: PausePoint = Field(
        default="none",
        description="Test hook: freeze at this point (writing <data_dir>/paused-<point>) so a test can SIGKILL there.",
    )

    @model_validator(mode="after")
    def _epochs_need_the_clip(self) -> LearnerSettings:
        if self.epochs > 1 and self.clip_eps is None:
            raise ValueError(
                f"epochs {self.epochs} trains each sample {self.epochs} times with nothing to hold the policy near "
                "the one that answered: set LIVELOOP_LEARNER_CLIP_EPS (0.2 is usual) or epochs 1"
            )
        return self

    @model_validator(mode="after")
    def _publishing_needs_both(self) -> LearnerSettings:
        if (self.dsn is None) != (self.mlflow_uri is None):
            raise ValueError(
                "set both LIVELOOP_LEARNER_DSN and LIVELOOP_LEARNER_MLFLOW_URI to publish checkpoints, or neither"
            )
        return self

    @property
    def publishes(self) -> bool:
        """Whether checkpoints are published (audit rows, MLflow, announcement) after they are written."""
        return self.dsn is not None and self.mlflow_uri is not None

    def shaping(self) -> ShapingSchedule:
        """The annealed shaping schedule of agent samples (:mod:`learner.shaping`)."""
        return ShapingSchedule(
            lambda_parallel=self.lambda_parallel,
            lambda_finish=self.lambda_finish,
            anneal_steps=self.lambda_anneal_steps,
        )

    def training_config(self) -> dict[str, Any]:
        """What determines the weights a stream of samples trains into; hashed into every manifest."""
        keys = (
            "base_model",
            "round_samples",
            "token_budget",
            "max_staleness",
            "is_cap",
            "clip_eps",
            "kl_coef",
            "baseline_decay",
            "lambda_parallel",
            "lambda_finish",
            "lambda_anneal_steps",
            "trajectory_wait_rounds",
            "lr",
            "weight_decay",
            "zero_stage",
            "lora",
            "lora_r",
            "lora_alpha",
            "lora_target_modules",
            "seed",
            "world_size",
        )
        config = {key: getattr(self, key) for key in keys}
        # A later setting is hashed only away from its default, so that the checkpoints written before it
        # existed keep their hash (and a learner resumes from them).
        if self.loss_weighting != "token":
            config["loss_weighting"] = self.loss_weighting
        if self.epochs != 1:
            config["epochs"] = self.epochs
        if self.min_advantage is not None:
            config["min_advantage"] = self.min_advantage
        return config
