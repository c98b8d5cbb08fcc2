"""Agent trajectories: the turns of one trajectory, their feedback and its outcome give one sample per trainable turn.

Pure and deterministic like :mod:`distill.reward`: the streaming app (through :mod:`distill.sessions`) and
replay run this very code. A trajectory is a tree of turns (generation events whose payload has a ``turn``);
a turn's feedback is the ``tool.result`` events (and any other feedback) naming its generation id; the
trajectory ends with its ``trajectory.outcome``, or times out without one (then ``finalised_by`` is
"timeout", performance counts as 0 and the ``timed_out`` guard fires: never finishing must not dodge a
bad reward).

Per trajectory (weights and parameters from :class:`distill.spec.AgentSpec`):

- critical steps: per stage, the non-sub-agent turns plus the longest sub-agent's turn count in that
  stage, summed over stages (a single agent's is its turn count). Frozen sub-agents' turns count.
- spawned sub-agents: the orchestrator's ``create_subagent`` calls, or the distinct sub-agents seen (in
  turns or the outcome) where those are more; finished: those the outcome reports finished that had a turn.
- ``r_perf`` = the outcome's performance (0 on a timeout).
- ``r_parallel`` = min(spawned, parallel_cap) / parallel_cap for an orchestrator trajectory, 0 otherwise:
  shaping against serial collapse that stops paying once the cap is reached.
- ``r_finish`` = finished / spawned (0 when none was spawned): shaping against fake parallelism.
- guards (metric by name, :data:`GUARDS`): ``serial_collapse`` 1 when an orchestrator spawned nothing yet
  took ``serial_steps`` turns or more; ``fake_parallelism`` the share of spawned sub-agents that never ran
  or never finished; ``invalid_tool_call`` the trainable turns' invalid calls
  (:func:`distill.reward.count_invalid_tool_calls`, calls refused for the budget left out); ``deferral``
  trainable turns that asked instead of acting (:func:`distill.reward.is_deferral`); ``give_up`` 1 when the
  outcome says it gave up after fewer than ``min_searches`` searches; ``budget_overrun`` turns served with
  ``context_tokens > budget_tokens`` plus the tool calls such turns made other than ``prune_chunks`` (the
  gateway refuses those); ``timed_out`` 1 without an outcome.
- ``components``: ``performance * r_perf`` and each guard's weight times its metric (guards at 0 left
  out); ``reward = clip(fsum(components))``. No surface normalisation: it is tuned for single turns.

One sample per trainable turn (not frozen; summary turns are trainable), with the trajectory's reward,
its own mask (:func:`distill.samples.loss_mask_for`: non-policy spans masked), its own deferral and
invalid-call count, and :class:`distill.samples.AgentCredit`.

A turn the product checked on its own (a ``tests.result`` naming the turn's generation: a summary's facts against
the context it summarised, a patch's tests) adds ``turn_check * passed / (passed + failed)`` of its last such check
to its own sample's components and reward, with a ``turn_check`` weight above 0. One reward for the whole
trajectory cannot say which of several summaries kept the facts; the turn's own check can. With a ``span_check``
weight above 0, the spans of that check (the parts of the completion it passed or failed: each fact of a summary)
ride in :attr:`distill.samples.AgentCredit.spans`, ``+span_check`` for each part that passed and ``-span_check``
for each that failed, and the learner adds them to those tokens' advantage alone: one turn's check cannot say which
fact of a summary was made up; its spans can. They are token credit only: the reward the gate judges is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

from distill.errors import DistillError, PrivacyModeEvent
from distill.reward import count_invalid_tool_calls, counted_feedback, is_deferral, last_tests_run, served_sample
from distill.samples import AgentCredit, CreditedSpan, FinalisedBy, Sample
from distill.spec import AgentSpec, RewardSpec
from ingest.events import EventBase, GenerationEvent, ToolResultEvent, TrajectoryOutcomeEvent
from ingest.payloads import GenerationPayload, TestsResultPayload, TurnPlace

CREATE_SUBAGENT = "create_subagent"
"""The orchestrator's tool that spawns a sub-agent."""
SEARCH = "search"
"""The search agent's search tool (counted against ``min_searches``)."""
PRUNE_CHUNKS = "prune_chunks"
"""The one tool the gateway still allows past a trajectory's hard budget."""
GUARDS = (
    "budget_overrun",
    "deferral",
    "fake_parallelism",
    "give_up",
    "invalid_tool_call",
    "serial_collapse",
    "timed_out",
)
"""The agent guards, by the name of their metric (and of their weight in :class:`distill.spec.AgentWeights`)."""


class InvalidTrajectory(DistillError):
    """Turns or an outcome that cannot form one trajectory (mixed trajectory ids, no turns). A caller bug."""


@dataclass(frozen=True)
class TrajectoryCredit:
    """What one finalised trajectory earned, before it is spread over its trainable turns."""

    trajectory_id: UUID
    finalised_by: FinalisedBy
    turns: int
    trainable_turns: int
    critical_steps: int
    spawned: int
    finished: int
    searches: int
    prunes: int
    r_perf: float
    r_parallel: float
    r_finish: float
    guards: dict[str, float]
    components: dict[str, float]
    reward: float


def place(event: GenerationEvent) -> TurnPlace:
    """The turn's place; raises :class:`InvalidTrajectory` for a generation that is not an agent turn."""
    turn = event.payload.turn
    if turn is None:
        raise InvalidTrajectory(f"generation {event.payload.generation_id} has no turn: it is not an agent turn")
    return turn


def unique_turns(turns: Iterable[GenerationEvent]) -> list[GenerationEvent]:
    """The turns, one per generation id (the earliest by ``(ts, event_id)`` wins), by ``(ts, generation id)``."""
    first: dict[UUID, GenerationEvent] = {}
    # UUIDs compare as their canonical strings do, without writing each one out.
    for event in sorted(turns, key=lambda e: (e.ts, e.event_id)):
        first.setdefault(event.payload.generation_id, event)
    return sorted(first.values(), key=lambda e: (e.ts, e.payload.generation_id))


def critical_steps(places: Sequence[TurnPlace]) -> int:
    """Per stage, the non-sub-agent turns plus the longest sub-agent's turns in that stage, summed."""
    own: dict[int, int] = {}
    subs: dict[int, dict[str, int]] = {}
    for turn in places:
        if turn.agent == "subagent":
            per_agent = subs.setdefault(turn.stage, {})
            per_agent[turn.agent_id] = per_agent.get(turn.agent_id, 0) + 1
        else:
            own[turn.stage] = own.get(turn.stage, 0) + 1
    stages = set(own) | set(subs)
    return sum(own.get(stage, 0) + max(subs.get(stage, {}).values(), default=0) for stage in stages)


def refused_calls(payload: GenerationPayload) -> set[int]:
    """Indices of the turn's tool calls the gateway refuses: all but ``prune_chunks`` past the hard budget."""
    if not _over_budget(payload.turn):
        return set()
    return {index for index, call in enumerate(payload.tool_calls) if call.name != PRUNE_CHUNKS}


def assess(
    turns: Sequence[GenerationEvent],
    feedback: Iterable[EventBase],
    outcome: TrajectoryOutcomeEvent | None,
    spec: RewardSpec,
) -> tuple[TrajectoryCredit, dict[UUID, tuple[list[EventBase], int, bool]]]:
    """The trajectory's credit, and per turn (by generation id) its counted feedback, invalid calls and deferral.

    ``turns`` must be :func:`unique_turns` of one trajectory; ``feedback`` may hold any events (those that do
    not count for a turn are ignored, as in :func:`distill.reward.score`); ``outcome`` is ``None`` on a timeout.
    """
    agent = _agent_spec(spec)
    if not turns:
        raise InvalidTrajectory("a trajectory needs at least one turn to be credited")
    places = [place(event) for event in turns]
    trajectory_id = places[0].trajectory_id
    if any(p.trajectory_id != trajectory_id for p in places):
        raise InvalidTrajectory(f"turns of several trajectories were passed as trajectory {trajectory_id}")
    if outcome is not None and outcome.payload.trajectory_id != trajectory_id:
        raise InvalidTrajectory(f"the outcome of {outcome.payload.trajectory_id} was passed for {trajectory_id}")
    by_generation: dict[UUID, list[EventBase]] = {}
    for event in feedback:
        generation_id = getattr(getattr(event, "payload", None), "generation_id", None)
        if generation_id is not None:
            by_generation.setdefault(generation_id, []).append(event)
    per_turn: dict[UUID, tuple[list[EventBase], int, bool]] = {}
    invalid = deferrals = searches = overruns = prunes = create_calls = 0
    orchestrator = False
    for event, turn in zip(turns, places, strict=True):
        payload = event.payload
        counted: list[EventBase] = list(counted_feedback(event, by_generation.get(payload.generation_id, []), spec))
        refused = refused_calls(payload)
        names = [call.name for index, call in enumerate(payload.tool_calls) if index not in refused]
        searches += names.count(SEARCH)
        prunes += turn.boundary == "prune"
        overruns += len(refused) + _over_budget(turn)
        if turn.agent == "orchestrator":
            orchestrator = True
            create_calls += names.count(CREATE_SUBAGENT)
        if turn.frozen:
            continue  # the environment: its calls and questions are not the policy's doing
        results = (e for e in counted if isinstance(e, ToolResultEvent))
        turn_invalid = count_invalid_tool_calls(payload, results, skip=refused)  # refused: overruns instead
        turn_deferral = is_deferral(payload)
        invalid += turn_invalid
        deferrals += turn_deferral
        per_turn[payload.generation_id] = (counted, turn_invalid, turn_deferral)
    finished_ids = {s.agent_id for s in outcome.payload.subagents if s.finished} if outcome else set()
    ran = {p.agent_id for p in places if p.agent == "subagent"}
    known = ran | ({s.agent_id for s in outcome.payload.subagents} if outcome else set())
    spawned = max(create_calls, len(known))
    finished = len(finished_ids & ran)
    orchestrator_turns = sum(1 for p in places if p.agent == "orchestrator")
    gave_up = outcome is not None and outcome.payload.gave_up and searches < agent.params.min_searches
    guards = {
        "budget_overrun": float(overruns),
        "deferral": float(deferrals),
        "fake_parallelism": (spawned - finished) / spawned if spawned else 0.0,
        "give_up": float(gave_up),
        "invalid_tool_call": float(invalid),
        "serial_collapse": float(orchestrator and spawned == 0 and orchestrator_turns >= agent.params.serial_steps),
        "timed_out": float(outcome is None),
    }
    r_perf = outcome.payload.performance if outcome is not None else 0.0
    weights = agent.weights
    parts = {"performance": weights.performance * r_perf}
    for name, metric in guards.items():
        if metric:
            parts[name] = getattr(weights, name) * metric
    components = {name: parts[name] + 0.0 for name in sorted(parts)}  # + 0.0: no negative zero
    low, high = spec.clip
    credit = TrajectoryCredit(
        trajectory_id=trajectory_id,
        finalised_by="outcome" if outcome is not None else "timeout",
        turns=len(turns),
        trainable_turns=len(per_turn),
        critical_steps=critical_steps(places),
        spawned=spawned,
        finished=finished,
        searches=searches,
        prunes=prunes,
        r_perf=r_perf,
        r_parallel=min(spawned, agent.params.parallel_cap) / agent.params.parallel_cap if orchestrator else 0.0,
        r_finish=finished / spawned if spawned else 0.0,
        guards=guards,
        components=components,
        reward=min(max(math.fsum(components.values()), low), high) + 0.0,
    )
    return credit, per_turn


def trajectory_samples(
    turns: Iterable[GenerationEvent],
    feedback: Iterable[EventBase],
    outcome: TrajectoryOutcomeEvent | None,
    spec: RewardSpec,
    *,
    tokenizer: str | None = None,
) -> tuple[TrajectoryCredit, list[Sample]]:
    """Credit one trajectory and give one sample per trainable turn, by ``(ts, generation id)``.

    ``outcome`` is ``None`` when the trajectory timed out. Raises :class:`PrivacyModeEvent` if any turn is in
    privacy mode, :class:`InvalidTrajectory` for turns of several trajectories, and
    :class:`distill.errors.MisalignedTrajectory` when a turn's mask cannot be derived.
    """
    ordered = unique_turns(turns)
    private: list[EventBase] = [e for e in ordered if e.privacy_mode]
    if outcome is not None and outcome.privacy_mode:
        private.append(outcome)
    if private:
        raise PrivacyModeEvent(f"event {private[0].event_id} of a trajectory is in privacy mode; drop it")
    credit, per_turn = assess(ordered, feedback, outcome, spec)
    places = [place(event) for event in ordered]
    summarised = {p.parent_turn_id for p in places if p.boundary == "summary" and p.parent_turn_id is not None}
    samples: list[Sample] = []
    shared: list[AgentCredit] = []  # the first turn's, validated: the others copy its trajectory figures
    for event, turn in zip(ordered, places, strict=True):
        payload = event.payload
        if payload.generation_id not in per_turn:
            continue  # frozen: an observation, never trained on
        counted, invalid, deferral = per_turn[payload.generation_id]
        sources = {event.event_id, *(e.event_id for e in counted)}
        if outcome is not None:
            sources.add(outcome.event_id)
        weights = _agent_spec(spec).weights
        # The turn's own check, read once for both uses (and not at all where the spec weighs neither).
        check = last_tests_run(counted) if weights.turn_check or weights.span_check else None
        reward, components = _turn_reward(credit, check, spec)
        samples.append(
            served_sample(
                event,
                spec,
                reward=reward,
                components=components,
                sources=sources,
                finalised_by=credit.finalised_by,
                deferral=deferral,
                invalid_tool_calls=invalid,
                tokenizer=tokenizer,
                agent=_agent_credit(
                    credit,
                    turn,
                    turn.turn_id in summarised,
                    shared,
                    turn_spans(check, len(payload.completion), weights.span_check),
                ),
            )
        )
    return credit, samples


def turn_check(check: TestsResultPayload | None) -> float | None:
    """The pass share of the turn's last check (``tests.result``, :func:`distill.reward.last_tests_run` of its
    counted feedback); ``None`` without one or when it checked nothing (no test passed or failed)."""
    if check is None:
        return None
    total = check.passed + check.failed
    return check.passed / total if total else None


def turn_spans(check: TestsResultPayload | None, completion_chars: int, weight: float) -> list[CreditedSpan]:
    """The credited spans of the turn's last check: ``+weight`` for each part it passed, ``-weight`` for each it
    failed, by start; none with a zero weight or a check without spans. A span that runs past the completion (the
    product counted another text) is left out: it names no token of this turn."""
    if not weight or check is None or not check.spans:
        return []
    return [
        CreditedSpan(start=span.start, end=span.end, credit=weight if span.passed else -weight)
        for span in sorted(check.spans, key=lambda span: span.start)
        if span.end <= completion_chars
    ]


def _turn_reward(
    credit: TrajectoryCredit, check: TestsResultPayload | None, spec: RewardSpec
) -> tuple[float, dict[str, float]]:
    """The turn's reward and components: the trajectory's, plus its own check where the spec weighs one."""
    weight = _agent_spec(spec).weights.turn_check
    share = turn_check(check) if weight else None
    if share is None:
        return credit.reward, credit.components
    components = dict(sorted({**credit.components, "turn_check": weight * share + 0.0}.items()))
    low, high = spec.clip
    return min(max(math.fsum(components.values()), low), high) + 0.0, components


def _agent_credit(
    credit: TrajectoryCredit,
    turn: TurnPlace,
    summary_turn: bool,
    shared: list[AgentCredit],
    spans: list[CreditedSpan],
) -> AgentCredit:
    """The turn's :class:`AgentCredit`. The trajectory's figures are validated once, for its first turn; the
    others copy them with their own place, whose fields their validated :class:`TurnPlace` already checked, and
    their own spans, each validated as it was built."""
    own = {
        "turn_id": turn.turn_id,
        "agent": turn.agent,
        "agent_id": turn.agent_id,
        "stage": turn.stage,
        "boundary": turn.boundary,
        "summary_turn": summary_turn,
        "spans": spans,
    }
    if shared:
        return shared[0].model_copy(update=own)
    first = AgentCredit.model_validate(
        {
            **own,
            "trajectory_id": credit.trajectory_id,
            "frozen": False,
            "trajectory_turns": credit.trainable_turns,
            "critical_steps": credit.critical_steps,
            "r_perf": credit.r_perf,
            "r_parallel": credit.r_parallel,
            "r_finish": credit.r_finish,
            "guards": credit.guards,
        }
    )
    shared.append(first)
    return first


def _over_budget(turn: TurnPlace | None) -> bool:
    """Whether the turn was served with more context than its hard budget."""
    if turn is None or turn.context_tokens is None or turn.budget_tokens is None:
        return False
    return turn.context_tokens > turn.budget_tokens


def _agent_spec(spec: RewardSpec) -> AgentSpec:
    if spec.agent is None:
        raise InvalidTrajectory(
            f"reward spec {spec.version} has no agent section, so it cannot credit trajectories; "
            "its agent turns are scored as single-turn generations"
        )
    return spec.agent
