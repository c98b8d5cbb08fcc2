"""The sample contract of the ``liveloop.samples`` topic: one scored generation, ready to train on.

Owned by distill, imported by the learner (and the archiver and the evaluation gate). This module
imports nothing heavy and no YAML, so consumers stay light.

Decisions a consumer must know:

- ``sample_id`` is deterministic, :func:`sample_id_for` of the generation id and the spec hash: a
  re-delivered or replayed generation gives the same id, so consumers dedupe on it; scoring under
  another spec gives another id.
- A sample has no wall-clock field. ``generated_at`` is the generation event's time; replaying the
  same events under the same spec gives the same bytes (:func:`sample_to_json`).
- ``reward = clip(scale * sum(components) + offset)``: ``components`` (keyed by the weight names
  of :class:`distill.spec.Weights`) sum, with :func:`math.fsum`, to the raw reward before
  surface normalisation and clipping; see :mod:`distill.reward`.
- ``loss_mask`` has one 0/1 per completion token: 1 where the policy wrote the token (a ``policy``
  trajectory segment, or the whole completion of a generation without trajectory), 0 for tool,
  sub-agent, summary and user text. It is ``None`` exactly when there are no token ids.
- The evaluation split is :class:`HeldOutRule` of the one setting :class:`HeldOutSettings`: the learner
  never trains on it, records it in each checkpoint manifest, and the gate scores only candidates whose
  recorded rule is its own.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from itertools import pairwise
from typing import Annotated, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

from distill.errors import InvalidSample, MisalignedTrajectory
from infra.settings import LiveloopSettings
from ingest.payloads import AgentKind, Boundary, GenerationPayload, Identifier, Logprob, Name, TokenId

SAMPLE_SCHEMA_VERSION = 3
"""The sample schema version this code writes and the newest it reads. Version 2 added :class:`AgentCredit`,
version 3 its ``spans``."""

FinalisedBy = Literal["session_end", "window", "outcome", "timeout"]
"""Why a reward became final: the session ended, or the longest signal window passed; for an agent turn, its
trajectory's outcome arrived, or the trajectory timed out without one."""

_HEX_64 = r"^[0-9a-f]{64}$"
_HEX_32 = r"^[0-9a-f]{32}$"


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_utc)]


def _by_name(value: object) -> object:
    return dict(sorted(value.items())) if isinstance(value, dict) else value


def sample_id_for(generation_id: UUID | str, spec_hash: str) -> str:
    """The sample id: the first 32 hex digits of sha256 of ``"<generation_id>:<spec_hash>"``.

    The generation id is written in its canonical form (lower-case, hyphenated), so ``"0B7E..."`` and
    ``UUID("0b7e...")`` give the same id.
    """
    canonical = generation_id if isinstance(generation_id, UUID) else UUID(generation_id)
    return hashlib.sha256(f"{canonical}:{spec_hash}".encode()).hexdigest()[:32]


class CreditedSpan(BaseModel):
    """Token credit for one part of a turn's completion, characters ``[start, end)``: the turn's own check passed
    it (``credit`` > 0) or failed it (< 0). The learner adds ``credit`` to the advantage of the tokens that write
    those characters (:mod:`learner.rounds`); the sample's reward does not include it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    start: int = Field(ge=0)
    end: int = Field(gt=0)
    credit: float


class AgentCredit(BaseModel):
    """The trajectory's credit carried by the sample of one trainable agent turn.

    Every trainable turn of a trajectory gets a sample with the same trajectory-level figures: the learner
    groups them by ``trajectory_id`` (one unit for advantages, batch packing and the step count) and adds the
    annealed shaping terms ``lambda_parallel(t) * r_parallel + lambda_finish(t) * r_finish`` to the sample's
    ``reward``. ``reward`` itself (performance and the guards' penalties, see ``components``; plus the turn's own
    check where the spec weighs one, :mod:`distill.trajectory`) is all the gate and promotion judge. Summary turns
    are trainable: the final reward reaches the tokens that chose what to keep.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    trajectory_id: UUID
    turn_id: UUID
    agent: AgentKind
    agent_id: Identifier
    stage: int = Field(ge=0)
    boundary: Boundary = Field(description="How this turn's context was formed.")
    summary_turn: bool = Field(description="This turn wrote a summary that a later turn's context was formed from.")
    frozen: bool = Field(default=False, description="A frozen agent's turn: its loss mask is all zeros.")
    trajectory_turns: int = Field(ge=1, description="Trainable turns of the trajectory: samples sharing its id.")
    critical_steps: int = Field(ge=0, description="Per stage, orchestrator steps plus the longest sub-agent's, summed.")
    r_perf: float = Field(description="The verified outcome's performance, before the guards' penalties.")
    r_parallel: float = Field(ge=0.0, le=1.0, description="Shaping against serial collapse; the learner anneals it.")
    r_finish: float = Field(ge=0.0, le=1.0, description="Shaping against fake parallelism; the learner anneals it.")
    guards: Annotated[dict[str, float], BeforeValidator(_by_name)] = Field(
        default_factory=dict, description="Each guard's metric for the trajectory, by guard name."
    )
    spans: list[CreditedSpan] = Field(
        default_factory=list,
        description="This turn's parts that its own check judged, by start; empty unless the spec weighs span_check.",
    )


class Sample(BaseModel):
    """One scored generation. Closed, immutable and strict; validated on both ends of the topic."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    sample_id: str = Field(pattern=_HEX_32, description="sample_id_for(generation_id, spec_hash).")
    schema_version: int = Field(default=SAMPLE_SCHEMA_VERSION, ge=1)
    generation_id: UUID
    policy_version: int = Field(ge=0, description="The checkpoint version that produced the completion.")
    model: Name
    tokenizer: Name | None = Field(default=None, description="The served model's tokenizer, where known.")
    prompt: str
    completion: str
    prompt_token_ids: list[TokenId] | None = None
    completion_token_ids: list[TokenId] | None = None
    behaviour_logprobs: list[Logprob] | None = Field(
        default=None, description="The behaviour policy's logprob of each completion token."
    )
    loss_mask: list[Literal[0, 1]] | None = Field(default=None, description="1 = train on this completion token.")
    reward: float
    # Kept in name order, so that the JSON is canonical whatever order a reader (say jsonb) gives them in.
    components: Annotated[dict[str, float], BeforeValidator(_by_name)] = Field(
        description="Per-signal breakdown; fsum gives the raw reward."
    )
    source_event_ids: list[UUID] = Field(min_length=1, description="Generation and counted feedback, sorted.")
    spec_version: str
    spec_hash: str = Field(pattern=_HEX_64)
    session_id: str
    user_id: str
    tenant: str
    surface: Identifier
    task_kind: Identifier | None = None
    finalised_by: FinalisedBy
    privacy_mode: bool = Field(
        default=False,
        description="Always false from the distiller, which drops private sessions; consumers re-check and drop.",
    )
    deferral: bool
    invalid_tool_calls: int = Field(ge=0)
    generated_at: UtcDatetime = Field(description="The generation event's time, UTC.")
    agent: AgentCredit | None = Field(default=None, description="For an agent turn: its trajectory's credit.")

    @model_validator(mode="after")
    def _consistent(self) -> Sample:
        if self.schema_version > SAMPLE_SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {self.schema_version} is newer than this code reads ({SAMPLE_SCHEMA_VERSION}); "
                "upgrade liveloop"
            )
        expected = sample_id_for(self.generation_id, self.spec_hash)
        if self.sample_id != expected:
            raise ValueError(f"sample_id {self.sample_id} is not sample_id_for(generation_id, spec_hash) = {expected}")
        tokens = self.completion_token_ids
        for name, values in (("loss_mask", self.loss_mask), ("behaviour_logprobs", self.behaviour_logprobs)):
            if tokens is None and values is not None:
                raise ValueError(f"{name} is given but completion_token_ids is not")
            if tokens is not None and values is not None and len(values) != len(tokens):
                raise ValueError(f"{name} has {len(values)} entries for {len(tokens)} completion tokens")
        if tokens is not None and self.loss_mask is None:
            raise ValueError("loss_mask is required when completion_token_ids are given")
        if self.agent is not None and any(span.end > len(self.completion) for span in self.agent.spans):
            raise ValueError(f"a credited span runs past the completion's {len(self.completion)} characters")
        if self.agent is not None and self.agent.frozen and any(self.loss_mask or []):
            raise ValueError("a frozen agent's turn must have an all-zero loss_mask: frozen agents are not trained")
        ids = self.source_event_ids  # UUIDs sort as their strings do
        # Strictly increasing is unique and sorted, checked without hashing and sorting (every sample is validated).
        if not all(first < second for first, second in pairwise(ids)):
            raise ValueError("source_event_ids must be unique and sorted by their string form")
        return self


HELD_OUT_RULE_VERSION = 1
"""The version of :func:`held_out_bucket`. Bump it whenever that hash rule changes: a checkpoint whose manifest
names another version skipped another split, and the evaluation gate refuses it."""

HeldOutPercent = Annotated[int, Field(ge=0, le=50)]
"""The held-out share, 0..50 %: 0 keeps no evaluation split (the gate then has nothing to judge and rejects
every candidate; for tests that count intake exactly); above 50 the learner would hold out more than it trains on."""


def held_out_bucket(sample_id: str) -> int:
    """The sample's bucket, 0..99, under rule :data:`HELD_OUT_RULE_VERSION`: the first 8 hex digits of its id
    modulo 100. Sample ids are hex digests, so buckets are uniformly spread."""
    return int(sample_id[:8], 16) % 100


def held_out_key(sample_id: str, trajectory_id: UUID | str | None = None) -> str:
    """The id the split hashes: the sample's own, or for an agent turn a digest of its trajectory's id.

    A trajectory's turns share one reward, so they are all held out or none is: training on some turns and
    scoring the gate on the others would grade a candidate on the outcome it was trained on. The trajectory id
    is hashed (it is the product's UUID, not a digest like sample ids) so its buckets are uniform too. Rule
    version 1 is unchanged by this: single-turn samples hash as before, and agent samples (sample schema 2)
    did not exist under any code that split them otherwise.
    """
    if trajectory_id is None:
        return sample_id
    canonical = trajectory_id if isinstance(trajectory_id, UUID) else UUID(trajectory_id)
    return hashlib.sha256(f"trajectory:{canonical}".encode()).hexdigest()[:32]


def is_held_out(sample_id: str, percent: int) -> bool:
    """Whether a sample belongs to the evaluation split: ``percent`` % of ids, chosen by the id's hash.

    The learner never trains on these and the evaluation gate estimates rewards on them, so both import
    this one predicate (through :class:`HeldOutRule`) and neither restates it.
    """
    if not 0 <= percent <= 100:
        raise ValueError(f"held-out percent must lie in 0..100, not {percent}")
    return held_out_bucket(sample_id) < percent


class HeldOutRule(BaseModel):
    """The evaluation split a learner skipped and a gate scores on: its share and the hash rule's version.

    The learner writes it into every checkpoint manifest; the gate refuses a candidate whose rule is not its
    own, since it would otherwise score the candidate on samples it trained on.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    percent: HeldOutPercent
    rule_version: int = Field(default=HELD_OUT_RULE_VERSION, ge=1, description="HELD_OUT_RULE_VERSION in force.")

    def holds_out(self, sample_id: str, trajectory_id: UUID | str | None = None) -> bool:
        """Whether this rule keeps a sample out of training (for evaluation): ``sample_id``'s, or for an agent
        turn its ``trajectory_id``'s (:func:`held_out_key`)."""
        if self.rule_version != HELD_OUT_RULE_VERSION:
            raise ValueError(
                f"held-out rule version {self.rule_version} is not the one this code computes "
                f"({HELD_OUT_RULE_VERSION}); run the liveloop version that wrote it"
            )
        return is_held_out(held_out_key(sample_id, trajectory_id), self.percent)

    def holds_out_sample(self, sample: Sample) -> bool:
        """:meth:`holds_out` of a whole sample: by its trajectory when it is an agent turn."""
        return self.holds_out(sample.sample_id, None if sample.agent is None else sample.agent.trajectory_id)

    def describe(self) -> str:
        """``"<percent> % (rule v<version>)"``, for reasons and logs."""
        return f"{self.percent} % (rule v{self.rule_version})"


_RETIRED_VARIABLES = ("LIVELOOP_LEARNER_HELD_OUT_PERCENT", "LIVELOOP_GATE_HELD_OUT_PERCENT")


class HeldOutSettings(LiveloopSettings):
    """The one held-out share of the deployment, read by the learner and the gate. Env ``LIVELOOP_HELD_OUT_PERCENT``.

    One setting rather than one per service: two that differ let the gate score a candidate on its own
    training samples.
    """

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_")

    held_out_percent: HeldOutPercent = Field(
        default=10, description="Share of samples (by held_out_bucket) never trained on and scored by the gate."
    )

    @model_validator(mode="after")
    def _no_retired_variables(self) -> HeldOutSettings:
        # Unknown variables are ignored, so a deployment still setting the retired per-service shares
        # would silently run with the default: say so instead.
        retired = sorted(name for name in _RETIRED_VARIABLES if name in os.environ)
        if retired:
            raise ValueError(f"{', '.join(retired)} no longer exist: set LIVELOOP_HELD_OUT_PERCENT once instead")
        return self

    def rule(self) -> HeldOutRule:
        """The rule these settings and this code's hash rule make."""
        return HeldOutRule(percent=self.held_out_percent)


def sample_to_json(sample: Sample) -> bytes:
    """Compact UTF-8 JSON in field order; equal samples give equal bytes."""
    return sample.model_dump_json().encode("utf-8")


def parse_sample(data: bytes | bytearray | str) -> Sample:
    """Validate a sample from its JSON. Raises :class:`InvalidSample` with every problem, one line each."""
    try:
        return Sample.model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(sample)'}: {error['msg']}" for error in exc.errors()
        )
        raise InvalidSample(f"not a valid sample: {problems}") from exc


def loss_mask_for(generation: GenerationPayload) -> list[Literal[0, 1]] | None:
    """The loss mask over the generation's completion tokens, derived from its trajectory.

    Without token ids there is nothing to mask (``None``); without a trajectory the whole completion
    is the policy's (all ones). With one, the segments' token ids, concatenated in order, must equal
    ``completion_token_ids``, and tokens of ``policy`` segments get 1, all others 0. Otherwise
    :class:`MisalignedTrajectory` is raised, because guessing could train the policy on a tool's output.
    """
    tokens = generation.completion_token_ids
    if tokens is None:
        return None
    if generation.trajectory is None:
        return [1] * len(tokens)
    mask: list[Literal[0, 1]] = []
    joined: list[int] = []
    for index, segment in enumerate(generation.trajectory):
        if segment.token_ids is None:
            raise MisalignedTrajectory(
                f"generation {generation.generation_id}: trajectory segment {index} ({segment.role}) has no "
                "token_ids, so its place in completion_token_ids is unknown; send token_ids for every segment"
            )
        joined += segment.token_ids
        mask += [1 if segment.role == "policy" else 0] * len(segment.token_ids)
    if joined != tokens:
        raise MisalignedTrajectory(
            f"generation {generation.generation_id}: the trajectory's {len(joined)} segment token ids do not "
            f"equal its {len(tokens)} completion_token_ids; send segments whose token ids concatenate to them"
        )
    return mask
