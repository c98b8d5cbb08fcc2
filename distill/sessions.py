"""The distiller's per-session state machine, pure: no Faust, no Kafka, no clock of its own.

The streaming app keeps one ``SessionState`` per session in a changelog-backed table and feeds it
each event of the session (``apply_event``) and, periodically, the wall-clock time (``apply_tick``);
what comes out is the samples to publish and the feedback that arrived too late. Keeping this pure
lets tests drive it directly and lets replay reason about exactly the same rules.

Rules:
- A generation waits for its feedback until its session ends or its longest signal window passes
  (``distill.reward.final_at``), whichever comes first; then it is scored and becomes final.
- ``finalised_by`` is "session_end" when the session's end (by event time) came before the window
  closed, else "window": it depends on event times only, not on when a tick happened to run.
- Feedback for a final generation, or outside its signal's window, is late: recorded, never applied.
- Feedback that arrives before its generation (another producer, another path) waits as an orphan.
  An orphan never disappears silently: one still waiting when its session has ended and been quiet
  for ``ORPHAN_GRACE_S``, or when the session has been quiet for a whole longest window (it would
  expire), or that finds ``MAX_ORPHANS`` already waiting, comes out as ``unjoined`` with a reason
  a backend developer can act on (the app dead-letters it). The grace is there because a generation
  may reach the topic after its feedback and even after its session's end (the gateway's SDK and the
  ingest API are separate paths); such a generation still collects its orphans and is scored at once.
- A generation finalised with no feedback at all is counted (``Outcome.without_feedback``): that is
  what a backend sending its feedback under the wrong session looks like from here.
- An event seen before (same tenant and event id) changes nothing; a privacy-mode event marks the
  whole session private, and a private session keeps nothing and yields nothing.
- An agent turn (a generation with a ``turn``, under a spec with an ``agent`` section) is never scored on
  its own: it joins its trajectory (``SessionState.trajectories``), with the feedback naming it. The
  trajectory is finalised (:mod:`distill.trajectory`, one sample per trainable turn) ``orphan_grace_s`` after
  its session's last event once its outcome came: the last turn (emitted by the gateway) and the outcome (posted
  by the product) travel separate paths, and either may arrive first. An outcome whose turns never come is
  dead-lettered like an orphan. Without an outcome it times out ``agent.params.timeout_s`` after its last turn (event
  time, against the tick's clock), or ``orphan_grace_s`` after its ended session's last event. An outcome
  stamped past the timeout counts as none (replay decides the same from event times); a turn, feedback
  or outcome for a finalised trajectory is late (an outcome: dead-lettered, it names no generation).
- A sample stays in the session's outbox until it is surely delivered (``settle_outbox``): the
  app publishes it without waiting, and after a crash it publishes the outbox again (consumers drop
  the repeats by ``sample_id``), so a sample is never lost between the table and the topic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PrivateAttr

from distill.errors import MisalignedTrajectory
from distill.guards import admit_session, dedupe_key
from distill.reward import final_at, is_late, score
from distill.samples import FinalisedBy, Sample, loss_mask_for, sample_to_json
from distill.spec import RewardSpec
from distill.trajectory import TrajectoryCredit, trajectory_samples
from ingest.events import (
    EVENT_ADAPTER,
    Event,
    GenerationEvent,
    SessionEndedEvent,
    SessionStartedEvent,
    TrajectoryOutcomeEvent,
    event_to_json,
)

MAX_ORPHANS = 1000
"""Most feedback events a session holds for generations it has not seen yet."""
ORPHAN_GRACE_S = 60.0
"""How long (wall clock, after a session's last event) an ended session's orphans wait for their generation
by default (``DistillSettings.orphan_grace_s``): a generation reaches the topic seconds after its feedback at
worst, while a backend waiting for its dead letter should not wait long."""


class PendingGeneration(BaseModel):
    """A generation waiting for its reward to become final, with the feedback counted so far."""

    model_config = ConfigDict(extra="forbid")

    generation: str = Field(default="", description="The generation event, as JSON.")
    feedback: list[str] = Field(default_factory=list, description="Its feedback events, as JSON.")
    final_at: AwareDatetime
    # The same events already parsed, where this process saw them arrive: a session that starts and
    # ends within one batch is scored without parsing its events a second time. Events that arrived
    # here are written to the JSON fields only when the state is stored (``write_json``): most
    # generations are final before then, and serialising each of their events was wasted.
    _generation: GenerationEvent | None = PrivateAttr(default=None)
    _feedback: list[Event] | None = PrivateAttr(default=None)

    @classmethod
    def arrived(cls, event: GenerationEvent, spec: RewardSpec) -> PendingGeneration:
        """A generation that has just arrived (parsed), waiting for feedback until its longest window closes."""
        pending = cls(final_at=final_at(event, spec))
        parsed = pending._parsed()
        parsed["_generation"], parsed["_feedback"] = event, []
        return pending

    def generation_event(self) -> GenerationEvent:
        """The generation event (parsed from ``generation`` on first use after a load)."""
        parsed = self._parsed()
        if parsed["_generation"] is None:
            event = stored_event(self.generation)
            assert isinstance(event, GenerationEvent)
            parsed["_generation"] = event
        return parsed["_generation"]  # type: ignore[no-any-return]

    def feedback_events(self) -> list[Event]:
        """The feedback events, in arrival order (parsed from ``feedback`` on first use after a load)."""
        parsed = self._parsed()
        if parsed["_feedback"] is None:
            parsed["_feedback"] = [stored_event(raw) for raw in self.feedback]
        return parsed["_feedback"]  # type: ignore[no-any-return]

    def _parsed(self) -> dict[str, Any]:
        """The private attributes, as pydantic keeps them. Read and written here directly: pydantic's own
        access to a private attribute raises and catches an AttributeError each time (several µs, on
        every event the distiller reads)."""
        private = self.__pydantic_private__
        assert private is not None  # a model with private attributes always has the dict
        return private

    def add_feedback(self, event: Event) -> None:
        """Count one more feedback event."""
        self.feedback_events().append(event)

    def write_json(self) -> None:
        """Bring the JSON fields up to date with the events that arrived since the state was loaded."""
        parsed = self._parsed()
        if not self.generation:
            self.generation = event_to_json(parsed["_generation"]).decode()
        feedback = parsed["_feedback"]
        if feedback is not None and len(feedback) > len(self.feedback):
            self.feedback += [event_to_json(event).decode() for event in feedback[len(self.feedback) :]]


class PendingTrajectory(BaseModel):
    """An agent trajectory being assembled: its turns, their feedback, and its outcome once it came."""

    model_config = ConfigDict(extra="forbid")

    turns: list[str] = Field(default_factory=list, description="Its generation events, as JSON.")
    feedback: list[str] = Field(default_factory=list, description="Feedback naming its turns, as JSON.")
    outcome: str | None = Field(default=None, description="The trajectory.outcome event, as JSON.")
    last_turn_at: AwareDatetime | None = Field(default=None, description="Event time of its latest turn.")
    # As in PendingGeneration: the events that arrived here, parsed, written to JSON only when stored.
    _turns: list[Event] | None = PrivateAttr(default=None)
    _feedback: list[Event] | None = PrivateAttr(default=None)
    _outcome: Event | None = PrivateAttr(default=None)

    @classmethod
    def started(cls) -> PendingTrajectory:
        """A trajectory of which nothing has arrived yet (parsed lists empty, nothing to read back)."""
        pending = cls()
        private = pending._private()
        private["_turns"], private["_feedback"] = [], []
        return pending

    def turn_events(self) -> list[Event]:
        """The turns, in arrival order."""
        return self._events("_turns", self.turns)

    def feedback_events(self) -> list[Event]:
        """The feedback, in arrival order."""
        return self._events("_feedback", self.feedback)

    def outcome_event(self) -> Event | None:
        """The outcome, if it came."""
        private = self._private()
        if private["_outcome"] is None and self.outcome is not None:
            private["_outcome"] = stored_event(self.outcome)
        return private["_outcome"]  # type: ignore[no-any-return]

    def has_outcome(self) -> bool:
        """Whether the outcome came (it is written to ``outcome`` only when the state is stored)."""
        return self.outcome is not None or self._private()["_outcome"] is not None

    def set_outcome(self, event: TrajectoryOutcomeEvent) -> None:
        """Record the outcome; most trajectories are final at once, so it is serialised only if stored."""
        self._private()["_outcome"] = event

    def write_json(self) -> None:
        """Bring the JSON fields up to date with the events that arrived since the state was loaded."""
        outcome = self._private()["_outcome"]
        if outcome is not None and self.outcome is None:
            self.outcome = event_to_json(outcome).decode()
        for name, stored in (("_turns", self.turns), ("_feedback", self.feedback)):
            parsed = self._private()[name]
            if parsed is not None and len(parsed) > len(stored):
                stored += [event_to_json(event).decode() for event in parsed[len(stored) :]]

    def _events(self, name: str, stored: list[str]) -> list[Event]:
        private = self._private()
        if private[name] is None:
            private[name] = [stored_event(raw) for raw in stored]
        return private[name]  # type: ignore[no-any-return]

    def _private(self) -> dict[str, Any]:
        private = self.__pydantic_private__  # read directly, as PendingGeneration._parsed explains
        assert private is not None
        return private


class SessionState(BaseModel):
    """Everything the distiller remembers of one session (the value of its table)."""

    model_config = ConfigDict(extra="forbid")

    private: bool = False
    ended: str | None = Field(default=None, description="The session.ended event, as JSON.")
    pending: dict[str, PendingGeneration] = Field(default_factory=dict, description="By generation id.")
    orphans: list[str] = Field(default_factory=list, description="Feedback before its generation, as JSON.")
    finalised: dict[str, str] = Field(default_factory=dict, description="Generation id -> sample id.")
    seen: list[str] = Field(default_factory=list, description="Dedupe keys of the events applied.")
    admitted: int = Field(default=0, description="Samples admitted under the per-session cap.")
    outbox: dict[str, tuple[str, float]] = Field(
        default_factory=dict,
        description="Samples published but maybe not yet delivered: generation id -> (sample JSON, wall time).",
    )
    touched_at: float = Field(default=0.0, description="Wall-clock time of the last event (for expiry).")
    trajectories: dict[str, PendingTrajectory] = Field(
        default_factory=dict, description="Agent trajectories being assembled, by trajectory id."
    )
    turns: dict[str, str] = Field(default_factory=dict, description="Agent turns seen: generation id -> trajectory.")
    trajectories_done: list[str] = Field(default_factory=list, description="Ids of the finalised trajectories.")

    def dump(self) -> bytes:
        """The state as compact JSON bytes (the table's value, stored as is)."""
        for pending in self.pending.values():
            pending.write_json()
        for trajectory in self.trajectories.values():
            trajectory.write_json()
        return self.model_dump_json().encode()

    @classmethod
    def load(cls, data: bytes | None) -> SessionState:
        """The state from its JSON bytes; a session never seen starts empty."""
        return cls() if not data else cls.model_validate_json(data)


def stored_event(raw: str | bytes) -> Event:
    """An event this module stored, from its JSON.

    Every stored event passed :func:`ingest.events.parse_event` on its way in and was written back by
    :func:`ingest.events.event_to_json`, so the contract's model validates it directly, without the
    checks for hostile input that the ingest parser makes (depth, duplicate keys, size).
    """
    return EVENT_ADAPTER.validate_json(raw)


@dataclass
class Outcome:
    """What one step of the state machine produced."""

    samples: list[Sample] = field(default_factory=list)
    # Each sample's JSON (``sample_to_json``), serialised once for the outbox and the topic alike.
    sample_json: list[bytes] = field(default_factory=list)
    capped: list[Sample] = field(default_factory=list)
    late: list[Event] = field(default_factory=list)
    # Feedback that can never join its generation, with the reason (see the module docstring).
    unjoined: list[tuple[Event, str]] = field(default_factory=list)
    without_feedback: int = 0
    duplicate: bool = False
    private: bool = False
    trajectories: list[TrajectoryCredit] = field(default_factory=list)


def finalised_by(generation: GenerationEvent, ended: SessionEndedEvent | None, spec: RewardSpec) -> FinalisedBy:
    """How a generation's reward became final, from event times alone (see the module docstring)."""
    if ended is not None and ended.ts <= final_at(generation, spec):
        return "session_end"
    return "window"


def apply_event(state: SessionState, event: Event, spec: RewardSpec, now: float) -> Outcome:
    """Apply one event of the session to ``state`` (in place); return what it produced."""
    outcome = Outcome()
    if state.private or event.privacy_mode:
        # Forget everything: not even the ids of a private session's events are kept.
        state.private, state.pending, state.orphans, state.seen = True, {}, [], []
        state.trajectories, state.turns, state.trajectories_done = {}, {}, []
        outcome.private = True
        return outcome
    key = dedupe_key(event)
    seen = set(state.seen)
    if key in seen:
        outcome.duplicate = True
        return outcome
    state.seen.append(key)
    state.touched_at = now
    if isinstance(event, SessionStartedEvent):
        return outcome
    if isinstance(event, TrajectoryOutcomeEvent):
        if spec.agent is not None:  # a spec without agent credit scores agent turns alone and ignores outcomes
            _add_trajectory_outcome(state, event, spec, outcome, now)
        return outcome
    if isinstance(event, SessionEndedEvent):
        state.ended = event_to_json(event).decode()
        for generation_id in list(state.pending):
            _finalise(state, generation_id, spec, outcome, now, event)
        return outcome
    if isinstance(event, GenerationEvent):
        if event.payload.turn is not None and spec.agent is not None:
            _add_turn(state, event, outcome)
        else:
            _add_generation(state, event, spec, outcome, now)
        return outcome
    generation_id = str(_generation_id(event))
    if generation_id in state.finalised:
        outcome.late.append(event)
    elif generation_id in state.turns:
        trajectory = state.trajectories.get(state.turns[generation_id])
        if trajectory is None:
            outcome.late.append(event)  # a frozen turn of a finalised trajectory (no sample of its own)
        else:
            trajectory.feedback_events().append(event)
    elif generation_id in state.pending:
        pending = state.pending[generation_id]
        if is_late(pending.generation_event(), event, spec):
            outcome.late.append(event)
        else:
            pending.add_feedback(event)
    elif len(state.orphans) < MAX_ORPHANS:
        state.orphans.append(event_to_json(event).decode())
    else:
        reason = f"{MAX_ORPHANS} feedback events of it already wait for generations it has not seen"
        outcome.unjoined.append((event, unjoined_reason(event, reason)))
    return outcome


def apply_tick(state: SessionState, now: datetime, spec: RewardSpec, orphan_grace_s: float = ORPHAN_GRACE_S) -> Outcome:
    """Finalise every generation whose window has closed by ``now``; give up the orphans that are due."""
    outcome = Outcome()
    for generation_id, pending in list(state.pending.items()):
        if pending.final_at <= now:
            _finalise(state, generation_id, spec, outcome, now.timestamp())
    for trajectory_id, trajectory in list(state.trajectories.items()):
        if now.timestamp() >= trajectory_due(state, trajectory, spec, orphan_grace_s):
            _close_trajectory(state, trajectory_id, spec, outcome, now.timestamp())
    if state.orphans and now.timestamp() >= orphans_due(state, spec, orphan_grace_s):
        for raw in state.orphans:
            event = stored_event(raw)
            why = (
                f"it ended, and {orphan_grace_s:g} s after its last event the generation had not come"
                if state.ended
                else f"no event of it came for {spec.windows_s.longest} s"
            )
            outcome.unjoined.append((event, unjoined_reason(event, why)))
        state.orphans = []
    return outcome


def orphans_due(state: SessionState, spec: RewardSpec, orphan_grace_s: float = ORPHAN_GRACE_S) -> float:
    """When (epoch seconds) the session's orphans stop waiting: ``orphan_grace_s`` after the last event of an
    ended session, else when the session would expire."""
    quiet_s = orphan_grace_s if state.ended else float(spec.windows_s.longest)
    return state.touched_at + quiet_s


def trajectory_due(
    state: SessionState, trajectory: PendingTrajectory, spec: RewardSpec, orphan_grace_s: float = ORPHAN_GRACE_S
) -> float:
    """When (epoch seconds) a tick closes the trajectory (see the module docstring): an outcome that came
    before its turns is applied, or dead-lettered when none came; a trajectory without one times out."""
    if trajectory.last_turn_at is None:
        return orphans_due(state, spec, orphan_grace_s)  # an outcome alone: it waits for its turns like an orphan
    if trajectory.has_outcome():
        return state.touched_at + orphan_grace_s  # turns that came after their outcome: wait for stragglers
    assert spec.agent is not None  # turns are assembled only under a spec with an agent section
    due = trajectory.last_turn_at.timestamp() + spec.agent.params.timeout_s
    return min(due, state.touched_at + orphan_grace_s) if state.ended else due


def unjoined_reason(event: Event, why: str) -> str:
    """What a backend developer reads in the dead letter of feedback that joined no generation."""
    return (
        f"feedback {event.type} names generation {_generation_id(event)}, which session {event.session_id} never "
        f"had ({why}); send feedback under the session the gateway's X-Liveloop-Session response header "
        "(or the body's liveloop.session_id) names for that generation"
    )


def settle_outbox(state: SessionState, now: float, delivered_after_s: float) -> bool:
    """Drop outbox entries published more than ``delivered_after_s`` ago (by then surely delivered).

    The app sets ``delivered_after_s`` well above its commit interval: the producer is flushed, and
    so every earlier publication acknowledged, before any offset commit. True if anything was dropped.
    """
    settled = [g for g, (_, at) in state.outbox.items() if now - at > delivered_after_s]
    for generation_id in settled:
        del state.outbox[generation_id]
    return bool(settled)


def expired(state: SessionState, now: float, spec: RewardSpec) -> bool:
    """Whether the session's state can be dropped: nothing pending and quiet for a whole longest window.

    Until then, feedback for its final generations is still recognised (and recorded) as late.
    """
    return (
        not state.pending
        and not state.outbox
        and not state.orphans  # given up by a tick first (``apply_tick``), never dropped silently
        and not state.trajectories  # finalised or dead-lettered by a tick first, too
        and now - state.touched_at > spec.windows_s.longest
    )


def _add_generation(
    state: SessionState, event: GenerationEvent, spec: RewardSpec, outcome: Outcome, now: float
) -> None:
    generation_id = str(event.payload.generation_id)
    if generation_id in state.pending or generation_id in state.finalised:
        outcome.duplicate = True  # the same generation under another event id: keep the first
        return
    matching: list[str] = []
    others: list[str] = []
    for raw in state.orphans:
        (matching if str(_generation_id(stored_event(raw))) == generation_id else others).append(raw)
    state.orphans = others
    pending = PendingGeneration.arrived(event, spec)
    for raw in matching:
        feedback = stored_event(raw)
        if is_late(event, feedback, spec):
            outcome.late.append(feedback)
        else:
            pending.add_feedback(feedback)
    state.pending[generation_id] = pending
    if state.ended is not None:
        _finalise(state, generation_id, spec, outcome, now)


def _finalise(
    state: SessionState,
    generation_id: str,
    spec: RewardSpec,
    outcome: Outcome,
    now: float,
    ended: Event | None = None,
) -> None:
    pending = state.pending.pop(generation_id)
    generation = pending.generation_event()
    if ended is None and state.ended:
        ended = stored_event(state.ended)
    assert ended is None or isinstance(ended, SessionEndedEvent)
    feedback = pending.feedback_events()
    outcome.without_feedback += not feedback
    _emit(state, score(generation, feedback, spec, finalised_by(generation, ended, spec)), spec, outcome, now)


def _emit(state: SessionState, sample: Sample, spec: RewardSpec, outcome: Outcome, now: float) -> None:
    """Mark the sample's generation final and publish the sample, unless the per-session cap holds it back."""
    generation_id = str(sample.generation_id)
    state.finalised[generation_id] = sample.sample_id
    admitted, state.admitted = admit_session(state.admitted, spec.guards)
    if admitted:
        raw = sample_to_json(sample)
        outcome.samples.append(sample)
        outcome.sample_json.append(raw)
        state.outbox[generation_id] = (raw.decode(), now)
    else:
        outcome.capped.append(sample)


def _add_turn(state: SessionState, event: GenerationEvent, outcome: Outcome) -> None:
    """Add an agent turn to its trajectory, with the feedback that came before it."""
    generation_id = str(event.payload.generation_id)
    if generation_id in state.turns or generation_id in state.pending or generation_id in state.finalised:
        outcome.duplicate = True  # the same generation under another event id: keep the first
        return
    assert event.payload.turn is not None
    if not event.payload.turn.frozen:
        try:
            loss_mask_for(event.payload)  # checked now: at finalisation it would fail its whole trajectory
        except MisalignedTrajectory as exc:
            outcome.unjoined.append((event, f"agent turn not trainable, dead-lettered: {exc}"))
            return
    trajectory_id = str(event.payload.turn.trajectory_id)
    state.turns[generation_id] = trajectory_id
    if trajectory_id in state.trajectories_done:
        outcome.late.append(event)  # its trajectory was final already: recorded, never applied
        return
    trajectory = state.trajectories.get(trajectory_id) or PendingTrajectory.started()
    state.trajectories[trajectory_id] = trajectory
    trajectory.turn_events().append(event)
    if trajectory.last_turn_at is None or event.ts > trajectory.last_turn_at:
        trajectory.last_turn_at = event.ts
    if not state.orphans:
        return
    others: list[str] = []
    for raw in state.orphans:
        feedback = stored_event(raw)
        if str(_generation_id(feedback)) == generation_id:
            trajectory.feedback_events().append(feedback)  # its window is checked when the trajectory is scored
        else:
            others.append(raw)
    state.orphans = others


def _add_trajectory_outcome(
    state: SessionState, event: TrajectoryOutcomeEvent, spec: RewardSpec, outcome: Outcome, now: float
) -> None:
    """Record a trajectory's outcome; a tick finalises the trajectory ``orphan_grace_s`` after its session's last
    event (:func:`trajectory_due`), not at once: the product posts the outcome through the ingest API right after
    the last turn, which the gateway emits on another path, so that turn may reach the topic after it."""
    trajectory_id = str(event.payload.trajectory_id)
    trajectory = state.trajectories.get(trajectory_id)
    if trajectory_id in state.trajectories_done or (trajectory is not None and trajectory.has_outcome()):
        why = "it was finalised already (by an earlier outcome or a timeout)"
        if trajectory is not None:
            why = "it has an outcome already; send one per trajectory"
        outcome.unjoined.append((event, f"trajectory.outcome for trajectory {trajectory_id} changes nothing: {why}"))
        return
    if trajectory is None:
        trajectory = state.trajectories[trajectory_id] = PendingTrajectory.started()
    trajectory.set_outcome(event)


def _close_trajectory(state: SessionState, trajectory_id: str, spec: RewardSpec, outcome: Outcome, now: float) -> None:
    """Finalise the trajectory (by its outcome or a timeout), or dead-letter an outcome whose turns never came."""
    trajectory = state.trajectories.pop(trajectory_id)
    state.trajectories_done.append(trajectory_id)
    ended = trajectory.outcome_event()
    if trajectory.last_turn_at is None:
        assert ended is not None
        why = (
            f"trajectory.outcome names trajectory {trajectory_id}, of which session {ended.session_id} never had a "
            "turn; send every turn of a trajectory and its outcome under the same session_id"
        )
        outcome.unjoined.append((ended, why))
        return
    assert spec.agent is not None
    assert ended is None or isinstance(ended, TrajectoryOutcomeEvent)
    if ended is not None and ended.ts > trajectory.last_turn_at + timedelta(seconds=spec.agent.params.timeout_s):
        ended = None  # stamped after the trajectory had timed out: it counts as none, as replay decides
    turns = [event for event in trajectory.turn_events() if isinstance(event, GenerationEvent)]
    credit, samples = trajectory_samples(turns, trajectory.feedback_events(), ended, spec)
    outcome.trajectories.append(credit)
    for sample in samples:
        _emit(state, sample, spec, outcome, now)


def _generation_id(event: Any) -> Any:
    return event.payload.generation_id
