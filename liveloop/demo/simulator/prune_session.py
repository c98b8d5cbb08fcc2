"""One ``prune`` episode as a product with a search agent runs it, through the code simulator's public surfaces:
the gateway (``/v1/completions``, the official ``openai`` client) and the SDK.

1. ``session.started`` (surface ``agent``);
2. the product opens the task with its own first search (:func:`~liveloop.demo.simulator.pruning.start`), then each
   model turn is one served turn of the session's trajectory (agent ``single``): a raw completion of the episode's
   prompt, stopped at a newline, at most :func:`~liveloop.demo.simulator.pruning.answer_bytes` tokens, the turn
   before it as parent, boundary ``prune`` when that turn dropped chunks. The product reads the answer
   (:func:`~liveloop.demo.simulator.pruning.read_decision`) and acts on it
   (:func:`~liveloop.demo.simulator.pruning.advance`: search on, prune, take the answer, or refuse past the hard
   budget), until an answer is accepted or ``max_turns`` is reached. A turn it cannot read (garbled, or a tool-call
   block that does not parse) it reports as a failed action, a ``tool.result`` with ``valid`` false
   (:func:`failed_actions`);
3. the verified outcome (:func:`~liveloop.demo.simulator.pruning.outcome_event`: success, and whether the agent
   answered without a value), then ``session.ended``.

The gateway measures each turn's context itself (one token per byte: the prompt's ``ctx``); with its budget set to
the task's (``LIVELOOP_SERVING_BUDGET_HARD_TOKENS``) its events carry the budget the distiller's guard reads.
The :class:`PruneRecord` returned is the product's own view; :class:`PruneTally` counts them by the policy version
that served the first turn, for the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from liveloop.demo.simulator.agent_session import end_session, failed_action_event, start_session
from liveloop.demo.simulator.pruning import (
    DEFAULT_SETTINGS,
    Decision,
    PruneOutcome,
    PruneSettings,
    advance,
    answer_bytes,
    draw_task,
    next_boundary,
    outcome_event,
    read_decision,
    settle,
    start,
    task_rng,
)
from liveloop.demo.simulator.session import EventSink
from liveloop.demo.simulator.stats import rate_figure
from liveloop.demo.simulator.tally import VersionTally
from liveloop.demo.simulator.transport import GatewayClient


@dataclass(frozen=True)
class PruneRecord:
    """One trajectory as the product saw it: the settled episode, and the policy version of its first turn (a swap
    mid-episode is rare)."""

    policy_version: int
    outcome: PruneOutcome

    @property
    def served_turns(self) -> int:
        """Model turns served through the gateway (one per turn of the episode)."""
        return len(self.outcome.episode.turns)


def prune_session_id(run_id: str, index: int) -> str:
    """The id of prune session ``index`` of run ``run_id``."""
    return f"prune-{run_id}-{index}"


def run_prune_session(
    gateway: GatewayClient,
    sink: EventSink,
    index: int,
    *,
    seed: int,
    run_id: str,
    tenant: str = "default",
    temperature: float = 1.0,
    settings: PruneSettings = DEFAULT_SETTINGS,
) -> PruneRecord:
    """Run prune session ``index`` of run ``run_id`` to its end (see the module docstring) and return its record.

    The task and the sampling seeds repeat for ``(seed, index)``; the session id carries ``run_id`` so that two
    runs never share one. Raises what the gateway client raises (``openai.OpenAIError``) if a turn fails.
    """
    rng = task_rng(seed, index)
    episode = start(draw_task(rng, settings), settings)
    session = start_session(sink, prune_session_id(run_id, index), index, tenant)
    request = session.request()
    max_tokens = answer_bytes(settings)
    versions: list[int] = []
    parent: str | None = None
    while not episode.done:
        turn = {"trajectory_id": str(session.trajectory_id), "agent": "single", "boundary": next_boundary(episode)}
        if parent is not None:
            turn["parent_turn_id"] = parent
        served = gateway.complete(
            episode.prompt(),
            **request,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=rng.randrange(2**31),
            turn=turn,
        )
        parent = served.generation_id
        versions.append(served.policy_version)
        decision = read_decision(served.text)
        for _ in range(failed_actions(decision)):
            failed = failed_action_event(
                session.envelope, UUID(served.generation_id), datetime.now(UTC), tool=ACTION, error=UNREADABLE
            )
            sink.emit(failed)
        episode = advance(episode, decision)
    outcome = settle(episode)
    sink.emit(outcome_event(session.envelope, session.trajectory_id, outcome, datetime.now(UTC)))
    end_session(sink, session)
    return PruneRecord(policy_version=versions[0], outcome=outcome)


UNREADABLE = "neither search, a valid prune_chunks call nor an answer"
"""The error of a failed action the product reports (:func:`failed_actions`)."""
ACTION = "action"
"""The tool name of a failed action's ``tool.result``: the product could not tell which tool the turn meant."""


def failed_actions(decision: Decision) -> int:
    """How many failed actions the product reports for a turn with ``decision``, a ``tool.result`` with ``valid``
    false each (:data:`UNREADABLE`): every tool-call block that did not parse or named another tool, and one for a
    garbled turn without any. The distiller charges each as an invalid tool call (-0.5 by default), so that an
    unreadable turn costs at least what giving up does: a 12-minute demo, when garbled turns cost nothing, learned
    to trade give-ups (-0.5) for them (docs/agent-learnability.md). The gateway reads no calls on the completions
    endpoint, so nothing else reports these."""
    return decision.invalid_calls or int(decision.kind == "garbled")


class PruneTally(VersionTally[PruneRecord]):
    """The records of a run by policy version, with 95 % Wilson intervals, over trajectories: ``success``,
    ``success_within_budget`` (the efficiency metric: right, with no budget overrun), ``budget_overrun`` (episodes
    with at least one), ``give_up`` (the planted hack); and ``garbled`` over model turns (nothing readable)."""

    def __init__(self) -> None:
        super().__init__(_figures)


def _figures(version: int, records: list[PruneRecord]) -> dict[str, Any]:
    outcomes = [record.outcome for record in records]
    turns = [turn for outcome in outcomes for turn in outcome.episode.turns]
    return {
        "policy_version": version,
        "trajectories": len(records),
        "success": rate_figure(o.success for o in outcomes),
        "success_within_budget": rate_figure(o.success_within_budget for o in outcomes),
        "budget_overrun": rate_figure(o.overran for o in outcomes),
        "give_up": rate_figure(o.give_up for o in outcomes),
        "garbled": rate_figure(turn.decision.kind == "garbled" for turn in turns),
    }
