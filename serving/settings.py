"""The serving stage's settings: ``ServingSettings`` (env prefix ``LIVELOOP_SERVING_``) and ``GateSettings``.

``ServingSettings`` covers the gateway (address, key, limits), the engine (torch or vLLM, device,
batching) and the emission of generation events (Kafka, the SDK's journal). The hot-swap controller and
the canary add their own fields at the end of the class. ``GateSettings`` (env prefix ``LIVELOOP_GATE_``)
configures the evaluation gate service (:mod:`serving.gate_service`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
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
from serving.regression import DEFAULT_SUITE

_IDENTIFIER = r"^[a-z][a-z0-9_.-]{0,63}$"


class ServingSettings(LiveloopSettings):
    """Settings of the serving gateway and its engine. Env prefix ``LIVELOOP_SERVING_``."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_SERVING_")

    # -- the gateway ------------------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", min_length=1, description="Address to listen on; loopback by default.")
    port: Port = Field(default=8000, description="TCP port of the OpenAI-compatible gateway.")
    credentials_path: Path = Field(
        default=Path(".liveloop/credentials.json"),
        description="Credential file (mode 0600); its gateway_key is the Bearer key every /v1 request must carry.",
    )
    model_name: str = Field(
        default="liveloop-policy",
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1F\x7F]+$",
        description="The MLflow registered model served; also the model id of /v1/models and of every response.",
    )
    default_max_tokens: int = Field(
        default=64, ge=1, le=4096, description="max_tokens of a request that does not set it (OpenAI's default is 16)."
    )
    max_tokens_limit: int = Field(
        default=1024, ge=1, le=4096, description="Largest max_tokens a request may ask for; more is refused with 400."
    )
    max_prompts: int = Field(
        default=16, ge=1, le=256, description="Most choices in one request (prompts times n); more is refused with 400."
    )
    max_request_bytes: int = Field(
        default=8 << 20,
        ge=1 << 10,
        le=1 << 30,
        description="Largest request body; a larger one is refused with 413 before it is read in full "
        "(a huge prompt would otherwise be buffered and tokenized only to be refused for the context).",
    )
    max_concurrent_requests: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Requests waiting on the engine at once (threads blocked in Engine.generate); more queue up.",
    )
    default_surface: str = Field(
        default="api",
        pattern=_IDENTIFIER,
        description="Surface of a generation event when the request has no X-Liveloop-Surface header.",
    )
    default_user: str = Field(
        default="anonymous",
        min_length=1,
        max_length=128,
        description="User id of a generation event when neither X-Liveloop-User nor the OpenAI 'user' field is set.",
    )
    default_tenant: str = Field(
        default="default",
        pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$",
        description="Tenant of a generation event when the request has no X-Liveloop-Tenant header.",
    )
    budget_soft_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1 << 24,
        description="Context budget of agent turns (requests placed in a trajectory): a turn served with more "
        "prompt tokens than this is told so (liveloop.budget, X-Liveloop-Budget: soft). Unset: no soft threshold.",
    )
    budget_hard_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1 << 24,
        description="Hard context budget of agent turns: past it, every tool call but prune_chunks is refused "
        "(serving.turns). Unset (the default): no budget.",
    )

    # -- the engine -------------------------------------------------------------------------------
    engine: Literal["torch", "vllm"] = Field(
        default="torch", description="torch: transformers on CPU or GPU (the default); vllm: GPUs only."
    )
    device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="Torch device: auto picks cuda when a GPU is present, else cpu.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights' dtype: auto is float32 on cpu and bfloat16 on cuda."
    )
    max_batch: int = Field(default=8, ge=1, le=512, description="Most sequences the torch engine decodes together.")
    batch_wait_ms: float = Field(
        default=5.0,
        ge=0.0,
        le=1000.0,
        description="How long the torch engine's batcher waits for more requests to join a batch that is not full.",
    )
    engine_process: bool = Field(
        default=True,
        description="Run the torch engine in a child process of its own, so that decoding never waits for the "
        "GIL while the HTTP side parses, answers and emits (serving.engine_process); false keeps it in the "
        "gateway's process.",
    )
    torch_threads: int = Field(
        default=1,
        ge=0,
        le=1024,
        description="Torch intra-op threads of the torch engine's process (on the CPU); 0 keeps torch's "
        "default, one per core. 1 suits small models: at batch sizes of a few rows the extra threads only spin, "
        "taking the core that the HTTP event loop and the event sender need.",
    )
    model_folder: Path | None = Field(
        default=None,
        description="A Hugging Face folder to load at start-up as model_version, for serving without the swap "
        "controller; unset, the swap controller loads the registry's champion.",
    )
    model_version: int = Field(default=0, ge=0, description="Policy version of model_folder.")
    vllm_gpu_memory_utilization: float = Field(
        default=0.85, gt=0.0, le=1.0, description="Share of GPU memory vLLM may take (weights + KV cache)."
    )
    vllm_max_model_len: int | None = Field(
        default=None, ge=16, description="vLLM's context length; unset takes the model config's."
    )
    vllm_max_lora_rank: int = Field(default=64, ge=1, le=512, description="Largest LoRA rank vLLM accepts.")
    vllm_max_loras: int = Field(
        default=2, ge=1, le=64, description="LoRA adapters vLLM keeps on the GPU at once (old and new version)."
    )

    # -- generation events ------------------------------------------------------------------------
    bootstrap: KafkaBootstrap = Field(
        default=KAFKA_BOOTSTRAP_DEFAULT,
        description="Kafka bootstrap (host:port,...) the generation events are sent to.",
    )
    events_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().events.name,
        description="The events topic every generation event goes to.",
    )
    sdk_journal_dir: Path = Field(
        default=Path(".liveloop/serving-journal"),
        description="The ingest SDK's on-disk journal of the gateway: events wait here while Kafka is away.",
    )

    # -- hot-swap and canary (serving/swap.py, serving/canary.py) ---------------------------------
    mlflow_url: MlflowUrl = Field(
        default=MLFLOW_URL_DEFAULT,
        description="MLflow tracking/registry URI: the champion and candidate aliases of model_name live there.",
    )
    promotions_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().promotions.name,
        description="Decisions the swap controller follows (and where it reports swap-failed).",
    )
    checkpoints_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().checkpoints.name,
        description="New candidates announced by the learner; the swap controller stages each (swap_stage_candidate).",
    )
    swap_reconcile_interval_s: float = Field(
        default=30.0,
        gt=0.0,
        le=3600.0,
        description="How often the swap controller re-reads the aliases even without an event.",
    )
    swap_work_dir: Path = Field(
        default=Path(".liveloop/serving-models"),
        description="Where the swap controller downloads model versions; one folder per loaded version.",
    )
    swap_keep_previous: bool = Field(
        default=True,
        description="Keep the previous champion loaded after a swap, so that a rollback is a switch (no download).",
    )
    swap_stage_candidate: bool = Field(
        default=True,
        description="Download, check and load (not serve) the candidate while it is evaluated, so that its promotion "
        "is a switch; costs one more version in memory (ignored with a canary, which loads it anyway).",
    )
    swap_unload_grace_s: float = Field(
        default=5.0,
        ge=0.0,
        le=600.0,
        description="How long a retired version stays loaded, so that requests routed to it just before still run.",
    )
    canary_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of sessions (sticky by session id) served by the candidate alias; 0 turns canaries off.",
    )

    @model_validator(mode="after")
    def _budget_ordered(self) -> ServingSettings:
        soft, hard = self.budget_soft_tokens, self.budget_hard_tokens
        if soft is not None and hard is not None and soft > hard:
            raise ValueError(f"budget_soft_tokens {soft} is over budget_hard_tokens {hard}; the soft one comes first")
        return self


class GateSettings(LiveloopSettings):
    """Settings of the evaluation gate service. Env prefix ``LIVELOOP_GATE_``."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_GATE_")

    bootstrap: KafkaBootstrap = KAFKA_BOOTSTRAP_DEFAULT
    checkpoints_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().checkpoints.name, description="Announcements in."
    )
    promotions_topic: TopicName = Field(
        default_factory=lambda: TopicsSettings().promotions.name, description="Decisions out."
    )
    group_id: str = Field(default="liveloop-gate", min_length=1, description="Consumer group of the gate.")
    dsn: PostgresDsn = Field(description="PostgreSQL audit store (samples, evaluations, promotions).")
    mlflow_url: MlflowUrl = MLFLOW_URL_DEFAULT
    policy_path: Path | None = Field(default=None, description="Gate policy YAML/JSON; unset: GatePolicy defaults.")
    suite_path: Path = Field(default=DEFAULT_SUITE, description="The regression suite YAML/JSON.")
    # The held-out share is the deployment's one LIVELOOP_HELD_OUT_PERCENT (distill.samples.HeldOutSettings),
    # shared with the learner: two settings could differ and score a candidate on its training samples.
    max_held_out: int = Field(default=2000, ge=10, le=1_000_000, description="Newest held-out samples scored.")
    work_dir: Path | None = Field(default=None, description="Scratch space for downloads; unset: the system's temp.")
    poll_timeout_ms: int = Field(default=1000, ge=10, le=60_000)
    retry_s: float = Field(default=10.0, gt=0, le=3600, description="Wait before retrying after a transient error.")
