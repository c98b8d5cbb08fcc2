"""Payload models of the event contract, one per event shape, and the contract's size limits.

The envelope around these payloads lives in :mod:`ingest.events`. Every model here is closed
(unknown fields are rejected), immutable and strict: a value of the wrong JSON type is rejected
rather than coerced (``"5"`` is not an int, a list is not a string, ``1`` is not ``true``).
Identifiers (UUIDs) are the one exception: they arrive as strings in JSON and are parsed.

Free-text fields (anything a user or the model wrote: prompts, completions, tool arguments, error
messages) carry ``"x-liveloop-redacted": true`` in their JSON Schema; :mod:`ingest.redaction`
finds them by that mark, so a new free-text field is redacted as soon as it is marked.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, ClassVar, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

MAX_TEXT_CHARS = 200_000
"""Longest prompt, completion, tool-call arguments or trajectory segment text, in characters."""
MAX_TOKENS = 32_768
"""Longest token id or logprob list."""
MAX_TOOL_CALLS = 64
"""Most tool calls in one generation."""
MAX_TRAJECTORY_SEGMENTS = 256
"""Most segments in one agent trajectory."""
MAX_TOTAL_TEXT_CHARS = 2_000_000
"""Most free-text characters in one generation, all fields together (bounds the event's size)."""
MAX_TOTAL_TOKENS = 262_144
"""Most token ids plus logprobs in one generation, all lists together."""
MAX_ID_CHARS = 128
"""Longest session id or user id."""
MAX_NAME_CHARS = 256
"""Longest model, client, editor or tool name."""
MAX_MESSAGE_CHARS = 16_384
"""Longest short free text: a tool's error message, a session's end reason."""
MAX_COUNT = 2**31 - 1
"""Largest token id or test count: they must fit a signed 32-bit tensor."""
MAX_STAGE = 1024
"""Highest stage number of an agent trajectory (stage 0 is the first)."""
MAX_SUBAGENTS = 256
"""Most sub-agents one trajectory's outcome may report on."""
MAX_CHECKED_SPANS = 256
"""Most spans one check (``tests.result``) may give a verdict on."""

REDACTED_MARK = "x-liveloop-redacted"
"""JSON Schema key that marks a free-text field which redaction must scrub."""
_REDACTED: JsonDict = {REDACTED_MARK: True}

# Printable, single-line names: they end up in metric labels, log lines and Kafka headers.
_NAME_PATTERN = r"^[^\x00-\x1F\x7F]+$"
_IDENTIFIER_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}$"

Identifier = Annotated[str, Field(pattern=_IDENTIFIER_PATTERN, max_length=64)]
"""A lower-case machine name such as ``ide.tab``, ``agent`` or ``python``."""
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=_NAME_PATTERN)]
"""A printable single-line name such as a model, client or tool name."""
TokenId = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Logprob = Annotated[float, Field(le=0.0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Role = Literal["policy", "tool", "subagent", "summary", "user"]
AgentKind = Literal["orchestrator", "subagent", "single"]
"""Who served a turn: an orchestrator that splits work, one of its sub-agents, or a single agent."""
Boundary = Literal["none", "summary", "prune", "truncation"]
"""How a turn's context was formed: as it grew, from a summary of it, after a prune, or cut by truncation."""


class ContractModel(BaseModel):
    """Base of every model of the event contract: closed, immutable, strict, finite floats only."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _check_aligned(token_ids: list[int] | None, logprobs: list[float] | None, what: str) -> None:
    # The learner pairs logprob i with token i for off-policy correction; a shifted list would
    # silently train on the wrong importance weights, so a mismatch is a contract violation.
    if token_ids is not None and logprobs is not None and len(token_ids) != len(logprobs):
        raise ValueError(
            f"{what} has {len(logprobs)} logprobs but {len(token_ids)} token ids; send exactly one logprob per token"
        )


class SessionStartedPayload(ContractModel):
    """A user opened a session in a product surface."""

    surface: Identifier = Field(description="Where the session runs, e.g. 'ide.tab', 'ide.chat', 'agent'.")
    client: Name = Field(description="The product client, e.g. 'acme-vscode-extension'.")
    client_version: Name | None = None
    editor: Name | None = Field(default=None, description="The editor or host, e.g. 'vscode', 'jetbrains'.")
    editor_version: Name | None = None
    repo_language: Identifier | None = Field(
        default=None, description="Main language of the repository, e.g. 'python', if known."
    )


class ToolCall(ContractModel):
    """One tool call the model made in a generation."""

    name: Name
    arguments: str = Field(max_length=MAX_TEXT_CHARS, json_schema_extra=_REDACTED)
    valid: bool | None = Field(
        default=None, description="Whether the call parsed and matched the tool's schema; null if unchecked."
    )


class TrajectorySegment(ContractModel):
    """One ordered piece of an agent trajectory.

    The learner derives the loss mask from ``role``: only ``policy`` segments (text the policy
    generated) are trained on; ``tool``, ``subagent``, ``summary`` and ``user`` segments are context.
    ``token_ids`` and ``logprobs`` matter for ``policy`` segments, where they are the behaviour
    policy's tokens and per-token logprobs.
    """

    role: Role
    text: str = Field(max_length=MAX_TEXT_CHARS, json_schema_extra=_REDACTED)
    token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_TOKENS)
    logprobs: list[Logprob] | None = Field(default=None, max_length=MAX_TOKENS)

    @model_validator(mode="after")
    def _aligned(self) -> TrajectorySegment:
        _check_aligned(self.token_ids, self.logprobs, "segment")
        return self


class TurnPlace(ContractModel):
    """Where one served turn (one LLM call) sits in its agent trajectory.

    A trajectory is a tree of turns: ``parent_turn_id`` is the turn this one follows (for a sub-agent's first
    turn, the orchestrator turn that assigned its task). All turns of a trajectory and its outcome
    (:class:`TrajectoryOutcomePayload`) must carry the same ``session_id``: the distiller assembles a
    trajectory inside its session's state. ``frozen`` turns (sub-agents that are not trained) are the
    environment: they count for critical steps but never yield a sample. ``stage`` numbers the orchestrator's
    rounds of work (0, 1, ...); a stage's cost is the orchestrator's turns plus its longest sub-agent's.
    """

    trajectory_id: UUID = Field(strict=False, description="The trajectory this turn belongs to.")
    turn_id: UUID = Field(strict=False, description="This turn; the gateway uses the generation id.")
    parent_turn_id: UUID | None = Field(default=None, strict=False, description="The turn this one follows.")
    agent: AgentKind
    agent_id: Identifier = Field(
        default="main", description="Which agent instance, e.g. 'main', 'sub-1': sub-agents of one stage differ."
    )
    frozen: bool = Field(default=False, description="The agent is not trained: its turns are observations.")
    stage: int = Field(default=0, ge=0, le=MAX_STAGE, description="The orchestrator's round this turn belongs to.")
    boundary: Boundary = Field(default="none", description="How this turn's context was formed.")
    context_tokens: Count | None = Field(default=None, description="Tokens of context this turn was served with.")
    budget_tokens: Count | None = Field(
        default=None, description="The trajectory's hard context budget in force when this turn was served, if any."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TurnPlace:
        if self.frozen and self.agent != "subagent":
            raise ValueError(f"only a subagent can be frozen, not a {self.agent}: the trained policy is the one served")
        if self.parent_turn_id == self.turn_id:
            raise ValueError("parent_turn_id equals turn_id: a turn cannot follow itself")
        return self


class GenerationPayload(ContractModel):
    """One model output, as served: emitted by the serving gateway (or a product that serves itself).

    ``completion_logprobs`` are the behaviour policy's per-token logprobs of ``completion_token_ids``
    under ``policy_version``; the learner needs them for off-policy correction. An agent turn may add
    its whole ``trajectory``; see :class:`TrajectorySegment` for how it is masked.
    """

    generation_id: UUID = Field(strict=False, description="Id that every feedback event refers to.")
    model: Name
    policy_version: int = Field(ge=0, description="Version of the checkpoint that produced this output.")
    prompt: str = Field(max_length=MAX_TEXT_CHARS, json_schema_extra=_REDACTED)
    completion: str = Field(max_length=MAX_TEXT_CHARS, json_schema_extra=_REDACTED)
    prompt_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_TOKENS)
    completion_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_TOKENS)
    completion_logprobs: list[Logprob] | None = Field(default=None, max_length=MAX_TOKENS)
    latency_ms: float | None = Field(default=None, ge=0)
    tool_calls: list[ToolCall] = Field(default_factory=list, max_length=MAX_TOOL_CALLS)
    surface: Identifier = Field(description="Where the output was shown, e.g. 'ide.tab', 'agent'.")
    task_kind: Identifier | None = Field(default=None, description="e.g. 'completion', 'edit', 'chat'.")
    trajectory: list[TrajectorySegment] | None = Field(default=None, max_length=MAX_TRAJECTORY_SEGMENTS)
    turn: TurnPlace | None = Field(default=None, description="Its place in an agent trajectory, for an agent turn.")

    @model_validator(mode="after")
    def _consistent(self) -> GenerationPayload:
        _check_aligned(self.completion_token_ids, self.completion_logprobs, "completion")
        segments = self.trajectory or []
        chars = len(self.prompt) + len(self.completion)
        chars += sum(len(call.arguments) for call in self.tool_calls) + sum(len(s.text) for s in segments)
        if chars > MAX_TOTAL_TEXT_CHARS:
            raise PydanticCustomError(
                "event_too_large",
                "generation holds {chars} characters of text, over the limit of {limit}; "
                "truncate the prompt or the trajectory",
                {"chars": chars, "limit": MAX_TOTAL_TEXT_CHARS},
            )
        token_lists = [self.prompt_token_ids, self.completion_token_ids, self.completion_logprobs]
        for segment in segments:
            token_lists += [segment.token_ids, segment.logprobs]
        tokens = sum(len(values) for values in token_lists if values is not None)
        if tokens > MAX_TOTAL_TOKENS:
            raise PydanticCustomError(
                "event_too_large",
                "generation holds {tokens} token ids and logprobs, over the limit of {limit}; "
                "truncate the prompt tokens or the trajectory",
                {"tokens": tokens, "limit": MAX_TOTAL_TOKENS},
            )
        return self


class FeedbackPayload(ContractModel):
    """Base of every feedback payload: what the user did about one generation."""

    generation_id: UUID = Field(strict=False, description="The generation this feedback is about.")


class SuggestionPayload(FeedbackPayload):
    """A suggestion was accepted, rejected or dismissed (the event type says which)."""


class EditPayload(FeedbackPayload):
    """How much of an accepted edit survives ``seconds_after`` seconds later (persisted or reverted)."""

    fraction_remaining: float = Field(ge=0.0, le=1.0, description="Share of the inserted text still present.")
    seconds_after: float = Field(ge=0.0, description="Seconds between acceptance and this measurement.")


class FollowupPayload(FeedbackPayload):
    """The user's next message after a generation, as classified by the product."""

    dissatisfied: bool = Field(description="The follow-up expresses dissatisfaction with the answer.")
    rephrase: bool = Field(description="The follow-up rephrases the same request.")


class RatingPayload(FeedbackPayload):
    """An explicit thumbs rating."""

    thumbs: Literal["up", "down"]


class ToolResultPayload(FeedbackPayload):
    """The outcome of executing one of the generation's tool calls."""

    tool: Name
    valid: bool = Field(description="The call was well-formed and the tool accepted it.")
    error: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS, json_schema_extra=_REDACTED)
    call_index: int | None = Field(
        default=None, ge=0, lt=MAX_TOOL_CALLS, description="Index into the generation's tool_calls."
    )


class CheckedSpan(ContractModel):
    """One part of a generation's completion that a check judged on its own: characters ``[start, end)`` of the
    completion (Python string offsets), and whether that part passed (a fact in a summary the product found in the
    context, a hunk of a patch whose tests passed)."""

    start: int = Field(ge=0, le=MAX_TEXT_CHARS)
    end: int = Field(gt=0, le=MAX_TEXT_CHARS)
    passed: bool

    @model_validator(mode="after")
    def _ordered(self) -> CheckedSpan:
        if self.end <= self.start:
            raise ValueError(f"span end {self.end} must be after its start {self.start}")
        return self


class TestsResultPayload(FeedbackPayload):
    """Tests ran on the code after a generation was applied.

    ``spans`` optionally says which parts of the completion passed and which failed, for a distiller whose reward
    spec credits parts of a turn on their own (``agent.weights.span_check``); they must not overlap.
    """

    __test__: ClassVar[bool] = False  # not a pytest test class, despite the name

    passed: Count
    failed: Count
    spans: list[CheckedSpan] | None = Field(default=None, max_length=MAX_CHECKED_SPANS)

    @model_validator(mode="after")
    def _spans_apart(self) -> TestsResultPayload:
        ordered = sorted(self.spans or (), key=lambda span: span.start)
        for first, second in pairwise(ordered):
            if second.start < first.end:
                raise ValueError(
                    f"spans [{first.start}, {first.end}) and [{second.start}, {second.end}) overlap; "
                    "give each character one verdict at most"
                )
        return self


class SubagentOutcome(ContractModel):
    """Whether one sub-agent finished the sub-task it was given, as the product verified it."""

    agent_id: Identifier
    finished: bool = Field(description="It returned a usable result for its sub-task.")


class TrajectoryOutcomePayload(ContractModel):
    """How an agent trajectory ended, verified by the product (tests passed, task solved): its final reward.

    Sent once per trajectory, in the trajectory's session, after its last turn. ``score`` gives partial credit
    in [0, 1]; without it a success scores 1 and a failure 0. ``gave_up`` says the agent stopped without an
    answer (the search-then-give-up guard reads it).
    """

    trajectory_id: UUID = Field(strict=False)
    success: bool
    score: float | None = Field(default=None, ge=0.0, le=1.0, description="Partial credit; default 1 or 0.")
    verifier: Identifier | None = Field(default=None, description="What verified it, e.g. 'tests', 'exact_match'.")
    gave_up: bool = Field(default=False, description="The agent stopped without giving an answer.")
    subagents: list[SubagentOutcome] = Field(default_factory=list, max_length=MAX_SUBAGENTS)

    @model_validator(mode="after")
    def _consistent(self) -> TrajectoryOutcomePayload:
        names = [sub.agent_id for sub in self.subagents]
        if len(names) != len(set(names)):
            raise ValueError("subagents name an agent_id twice; send one outcome per sub-agent")
        return self

    @property
    def performance(self) -> float:
        """The verified performance in [0, 1]: ``score`` when given, else 1 for a success and 0 for a failure."""
        if self.score is not None:
            return self.score
        return 1.0 if self.success else 0.0


class SessionEndedPayload(ContractModel):
    """The session ended; rewards of its generations become final."""

    reason: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS, json_schema_extra=_REDACTED)
