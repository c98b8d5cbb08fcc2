"""A served turn's place in its agent trajectory, the per-trajectory context budget, and each choice's answer.

Placing a turn: request headers, or the body's ``liveloop`` object with the same fields (one or the other,
not both; a value the event contract refuses is a 400 naming the header or field):

- ``X-Liveloop-Trajectory`` (``trajectory_id``): the trajectory's UUID; required to place a turn.
- ``X-Liveloop-Parent-Turn`` (``parent_turn_id``): the turn this one follows (a UUID: that turn's
  generation id), e.g. for a sub-agent's first turn, the orchestrator turn that assigned its task.
- ``X-Liveloop-Agent`` (``agent``): ``orchestrator``, ``subagent`` or ``single`` (the default).
- ``X-Liveloop-Agent-Id`` (``agent_id``): which agent instance, e.g. ``sub-1``; default ``main``.
- ``X-Liveloop-Frozen`` (``frozen``): ``true`` for a sub-agent that is not trained.
- ``X-Liveloop-Stage`` (``stage``): the orchestrator's round, 0, 1, ...
- ``X-Liveloop-Boundary`` (``boundary``): ``none``, ``summary``, ``prune`` or ``truncation``.

A placed turn's generation event carries ``turn`` (:class:`ingest.payloads.TurnPlace`): ``turn_id`` is the
choice's generation id (returned in ``liveloop.generation_ids``), ``context_tokens`` the prompt's token count
and ``budget_tokens`` the hard budget in force. The token ids and logprobs are the ones served, never
re-tokenised. Without these headers nothing changes: the event has no ``turn``.

The budget (``ServingSettings.budget_soft_tokens``/``budget_hard_tokens``, off by default) applies to placed
turns and compares the turn's ``context_tokens`` with each threshold. The response then carries
``liveloop.budget`` = ``{"state": "ok"|"soft"|"hard", "context_tokens", "soft", "hard"}`` and the header
``X-Liveloop-Budget: <state>``. Past the soft threshold the state is ``soft``: a nudge to prune or finish.
Past the hard one (``hard``) every tool call other than ``prune_chunks`` is refused: it is not returned as a
tool call, the assistant message's content ends with an error saying so, ``liveloop.budget.refused`` lists
the refused calls (``choice``, ``name``, ``arguments``), and the generation event records them with
``valid: false``, beside ``context_tokens`` over ``budget_tokens`` (the distiller's budget-overrun guard).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from pydantic import ValidationError

from ingest.payloads import ToolCall, TurnPlace
from serving.errors import InvalidRequest
from serving.openai_schema import TurnPlaceBody
from serving.settings import ServingSettings
from serving.tool_calls import Call, parse_tool_calls

PRUNE_TOOL = "prune_chunks"
"""The one tool an agent may still call past the hard budget: pruning is how it gets back under it."""
BUDGET_HEADER = "X-Liveloop-Budget"
HEADERS = {
    "trajectory_id": "X-Liveloop-Trajectory",
    "parent_turn_id": "X-Liveloop-Parent-Turn",
    "agent": "X-Liveloop-Agent",
    "agent_id": "X-Liveloop-Agent-Id",
    "frozen": "X-Liveloop-Frozen",
    "stage": "X-Liveloop-Stage",
    "boundary": "X-Liveloop-Boundary",
}
"""The request headers that place a turn, by the :class:`TurnPlace` field each one sets."""
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


@dataclass(frozen=True)
class TurnRequest:
    """A request's checked place in its trajectory (every :class:`TurnPlace` field but the per-choice ones)."""

    fields: dict[str, Any]

    @property
    def trajectory_id(self) -> UUID:
        """The trajectory the request's turns belong to."""
        return UUID(str(self.fields["trajectory_id"]))

    def place(self, turn_id: UUID, context_tokens: int, budget_tokens: int | None) -> TurnPlace:
        """The place of one served choice (its turn)."""
        return TurnPlace(turn_id=turn_id, context_tokens=context_tokens, budget_tokens=budget_tokens, **self.fields)


def read_turn(headers: Any, body: TurnPlaceBody | None) -> TurnRequest | None:
    """The request's place from its headers or its ``liveloop`` object; None when it names none."""
    sent = {field: headers.get(name.lower()) for field, name in HEADERS.items()}
    sent = {field: value for field, value in sent.items() if value is not None}
    if sent and body is not None:
        raise InvalidRequest(
            "the turn's place is given both in X-Liveloop-* headers and in the body's liveloop object; send one",
            param="liveloop",
        )
    if body is not None:
        values: dict[str, Any] = body.model_dump(exclude_none=True)
        names = {field: f"liveloop.{field}" for field in HEADERS}
    elif sent:
        values = {field: _from_header(field, value.strip()) for field, value in sent.items()}
        names = HEADERS
    else:
        return None
    if "trajectory_id" not in values:
        name = names["trajectory_id"]
        raise InvalidRequest(f"{name} is missing: a turn placed in a trajectory must name it (a UUID)", param=name)
    values.setdefault("agent", "single")
    try:
        TurnPlace(turn_id=uuid.uuid4(), **values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "frozen"  # the one cross-field rule: frozen needs subagent
        name = names.get(field, field)
        raise InvalidRequest(f"{name} {str(values.get(field))[:80]!r} is refused: {first['msg']}", param=name) from exc
    return TurnRequest(values)


def _from_header(field: str, value: str) -> Any:
    name = HEADERS[field]
    if field == "frozen":
        if value.lower() not in _TRUE + _FALSE:
            raise InvalidRequest(f"{name} {value[:80]!r} must be true or false", param=name)
        return value.lower() in _TRUE
    if field == "stage":
        if not value.isascii() or not value.isdigit():
            raise InvalidRequest(f"{name} {value[:80]!r} must be a whole number (0, 1, ...)", param=name)
        return int(value)
    return value


@dataclass(frozen=True)
class BudgetCheck:
    """Where one placed turn's context stands against the budget."""

    state: Literal["ok", "soft", "hard"]
    context_tokens: int
    soft: int | None
    hard: int | None

    @classmethod
    def of(cls, settings: ServingSettings, context_tokens: int) -> BudgetCheck | None:
        """The check under ``settings``' budget; None when no budget is set."""
        soft, hard = settings.budget_soft_tokens, settings.budget_hard_tokens
        if soft is None and hard is None:
            return None
        state: Literal["ok", "soft", "hard"] = "ok"
        if hard is not None and context_tokens > hard:
            state = "hard"
        elif soft is not None and context_tokens > soft:
            state = "soft"
        return cls(state, context_tokens, soft, hard)

    def body(self, refused: list[tuple[int, Call]]) -> dict[str, Any]:
        """``liveloop.budget`` of the response; ``refused`` holds (choice index, call) pairs."""
        body: dict[str, Any] = {
            "state": self.state,
            "context_tokens": self.context_tokens,
            "soft": self.soft,
            "hard": self.hard,
        }
        if self.state == "hard":
            body["refused"] = [{"choice": i, "name": c.name, "arguments": c.arguments} for i, c in refused]
        return body


@dataclass(frozen=True)
class Answer:
    """One chat choice as returned: content, the tool calls returned, and what the event records."""

    content: str | None
    tool_calls: list[Call]
    recorded: list[ToolCall]
    refused: list[Call]
    finish_reason: str


def read_answer(
    text: str, finish_reason: str, tools: dict[str, list[str]] | None, budget: BudgetCheck | None
) -> Answer:
    """Read ``text`` for tool calls (none when ``tools`` is None) and apply the hard budget."""
    if tools is None:
        return Answer(text, [], [], [], finish_reason)
    parsed = parse_tool_calls(text, tools)
    returned, refused = parsed.returned, []
    content = parsed.content
    if budget is not None and budget.state == "hard":
        refused = [c for c in returned if c.name != PRUNE_TOOL]
        returned = [c for c in returned if c.name == PRUNE_TOOL]
        if refused:
            names = ", ".join(sorted({c.name for c in refused}))
            error = (
                f"[liveloop] refused tool calls ({names}): this turn's context of {budget.context_tokens} tokens is "
                f"over the hard budget of {budget.hard} tokens; only {PRUNE_TOOL} may be called now: prune your "
                "context or give your answer."
            )
            content = f"{content}\n{error}" if content else error
    refused_ids = {id(c) for c in refused}
    recorded = [
        ToolCall(name=c.name, arguments=c.arguments, valid=False) if id(c) in refused_ids else c.record()
        for c in parsed.calls
    ]
    return Answer(content, returned, recorded, refused, "tool_calls" if returned else finish_reason)
