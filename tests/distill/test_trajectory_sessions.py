"""Agent trajectories in the distiller's session state machine (pure): assembly across restarts, outcomes that
come first or never find their turns, timeouts, late events, privacy, and replay giving the same bytes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from distill.deadlines import DeadlineIndex
from distill.replay import replay_session
from distill.samples import Sample, sample_to_json
from distill.sessions import ORPHAN_GRACE_S, Outcome, SessionState, apply_event, apply_tick
from distill.spec import load_spec
from ingest.events import Event, GenerationEvent, TrajectoryOutcomeEvent, parse_event
from tests.distill.agent_trajectories import BASE, Tree, event_json, orchestrator_tree, segment, summary_tree

SPEC = load_spec()
assert SPEC.agent is not None
TIMEOUT_S = SPEC.agent.params.timeout_s


def feed(
    events: Sequence[Event], state: SessionState | None = None, restart: bool = True
) -> tuple[SessionState, Outcome]:
    """Apply the events at their own times; with ``restart``, store and reload the state after each one."""
    state = state or SessionState()
    total = Outcome()
    for event in events:
        outcome = apply_event(state, event, SPEC, event.ts.timestamp())
        merge(total, outcome)
        if restart:
            state = SessionState.load(state.dump())
    return state, total


def merge(total: Outcome, outcome: Outcome) -> None:
    total.samples += outcome.samples
    total.late += outcome.late
    total.unjoined += outcome.unjoined
    total.trajectories += outcome.trajectories


def settle(state: SessionState, outcome: Outcome) -> Outcome:
    """Tick once the outcome's grace has passed (a trajectory with an outcome is final then), into ``outcome``."""
    merge(outcome, apply_tick(state, datetime.fromtimestamp(state.touched_at + ORPHAN_GRACE_S, UTC), SPEC))
    return outcome


def expected(tree: Tree) -> list[bytes]:
    return tree.expected(SPEC)


def as_json(samples: Sequence[Sample]) -> list[bytes]:
    return [sample_to_json(s) for s in sorted(samples, key=lambda s: (s.generated_at, str(s.generation_id)))]


def test_a_trajectory_assembled_across_restarts_gives_one_sample_per_trainable_turn() -> None:
    tree, orchestrator = orchestrator_tree()
    state, outcome = feed(tree.parsed())
    assert outcome.samples == []  # the outcome waits a grace for turns still on their way (next test)
    settle(state, outcome)
    assert as_json(outcome.samples) == expected(tree)
    assert sorted(str(s.generation_id) for s in outcome.samples) == sorted(orchestrator)
    assert all(s.agent is not None and s.finalised_by == "outcome" for s in outcome.samples)  # none scored alone
    assert [c.critical_steps for c in outcome.trajectories] == [11]
    assert not state.trajectories
    assert not state.pending  # agent turns never wait as single-turn generations
    assert as_json(replay_session(tree.parsed(), set(), SPEC)) == expected(tree)


def test_the_last_turn_arriving_after_its_outcome_still_counts() -> None:
    # The gateway emits the last turn; the product posts the outcome to the ingest API the moment the turn
    # returns: the two paths race, and the outcome may reach the topic first.
    tree, _ = orchestrator_tree()
    events = tree.parsed()
    outcome = settle(*feed([*events[:-2], events[-1], events[-2]]))
    assert outcome.late == []
    assert as_json(outcome.samples) == expected(tree)


def test_an_outcome_before_its_turns_waits_for_them() -> None:
    tree, _ = summary_tree()
    events = tree.parsed()
    state, outcome = feed([events[-1], *events[:-1]])  # the outcome first
    assert outcome.samples == []
    last = events[-2].ts.timestamp()
    assert apply_tick(state, datetime.fromtimestamp(last + ORPHAN_GRACE_S - 1, UTC), SPEC).samples == []
    ticked = apply_tick(state, datetime.fromtimestamp(last + ORPHAN_GRACE_S, UTC), SPEC)
    assert as_json(ticked.samples) == expected(tree)
    assert {s.finalised_by for s in ticked.samples} == {"outcome"}


def test_an_outcome_whose_turns_never_come_is_dead_lettered_with_a_reason() -> None:
    tree = Tree(seed=21)
    tree.outcome(True)
    end = parse_event(event_json(_ended(tree.session_id, 2.0)))
    state, outcome = feed([*tree.parsed(), end])
    assert outcome.unjoined == []
    index = DeadlineIndex(SPEC, 60.0)
    index.update(b"k", 0, state)
    due = end.ts.timestamp() + ORPHAN_GRACE_S
    assert index.due(0, due - 1) == []
    assert index.due(0, due) == [b"k"]
    ticked = apply_tick(state, datetime.fromtimestamp(due, UTC), SPEC)
    [(event, reason)] = ticked.unjoined
    assert isinstance(event, TrajectoryOutcomeEvent)
    assert "never had a turn" in reason
    assert tree.trajectory_id in reason
    assert not state.trajectories


def test_a_trajectory_without_outcome_times_out_and_replay_agrees() -> None:
    tree = Tree(seed=22)
    first = tree.turn(calls=["search"])
    tree.turn(parent=first, calls=["read"])
    events = tree.parsed()
    state, _ = feed(events)
    deadline = events[-1].ts + timedelta(seconds=TIMEOUT_S)
    index = DeadlineIndex(SPEC, 60.0)
    index.update(b"k", 0, state)
    assert index.due(0, deadline.timestamp()) == [b"k"]
    assert apply_tick(state, deadline - timedelta(seconds=1), SPEC).samples == []
    ticked = apply_tick(state, deadline, SPEC)
    assert [s.finalised_by for s in ticked.samples] == ["timeout", "timeout"]
    assert {s.agent.guards["timed_out"] for s in ticked.samples if s.agent} == {1.0}
    assert as_json(ticked.samples) == expected(tree)
    assert replay_session(events, set(), SPEC, now=deadline - timedelta(seconds=1)) == []
    assert as_json(replay_session(events, set(), SPEC, now=deadline)) == expected(tree)
    # An outcome after the timeout changes nothing: dead-lettered, it names no generation.
    tree.outcome(True)
    late = apply_event(state, tree.parsed()[-1], SPEC, deadline.timestamp())
    assert late.samples == []
    assert "finalised already" in late.unjoined[0][1]


def test_an_outcome_stamped_past_the_timeout_counts_as_none() -> None:
    tree = Tree(seed=23)
    tree.turn()
    tree.clock += TIMEOUT_S + 1
    tree.outcome(True)
    outcome = settle(*feed(tree.parsed()))
    assert [s.finalised_by for s in outcome.samples] == ["timeout"]
    assert as_json(replay_session(tree.parsed(), set(), SPEC)) == as_json(outcome.samples)


def test_turns_and_feedback_after_the_outcome_are_late() -> None:
    tree, _ = summary_tree()
    state, outcome = feed(tree.parsed())
    settle(state, outcome)
    assert len(outcome.samples) == 5
    straggler = tree.turn()
    tree.tool_result(straggler, "read")
    tree.tool_result(str(outcome.samples[0].generation_id), "read", valid=False)
    _, after = feed(tree.parsed()[-3:], state)
    assert len(after.late) == 3
    assert after.samples == []


def test_a_private_session_keeps_no_trajectory() -> None:
    tree = Tree(seed=24)
    tree.turn()
    state, _ = feed(tree.parsed())
    assert state.trajectories
    private = Tree(seed=25, session_id=tree.session_id)
    private.turn()
    private.events[-1]["privacy_mode"] = True
    private_event = parse_event(event_json(private.events[-1]))
    feed([private_event], state, restart=False)
    assert (state.trajectories, state.turns, state.private) == ({}, {}, True)


def test_a_spec_without_agent_credit_scores_agent_turns_as_single_generations() -> None:
    old = SPEC.model_copy(update={"agent": None})
    tree, _ = summary_tree()
    state = SessionState()
    samples: list[Sample] = []
    for event in tree.parsed():
        samples += apply_event(state, event, old, event.ts.timestamp()).samples
    assert samples == []
    assert len(state.pending) == 5


def _ended(session_id: str, seconds: float) -> dict[str, object]:
    ts = (BASE + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
    return {
        "event_id": "00000000-0000-4000-8000-00000000ffff",
        "type": "session.ended",
        "ts": ts,
        "session_id": session_id,
        "user_id": "user-agent",
        "tenant": "acme",
        "payload": {"reason": "closed"},
    }


def test_a_turn_whose_mask_cannot_be_derived_is_dead_lettered_and_the_rest_is_scored() -> None:
    tree = Tree(seed=26)
    tree.turn()
    tree.turn(segments=[segment("policy", [1, 2])])
    tree.events[-1]["payload"]["completion_token_ids"] = [1, 2, 3]  # segments no longer add up to the completion
    tree.events[-1]["payload"]["completion_logprobs"] = [-0.5] * 3
    tree.outcome(True)
    outcome = settle(*feed(tree.parsed()))
    [(event, reason)] = outcome.unjoined
    assert isinstance(event, GenerationEvent)
    assert "segment token ids do not equal" in reason
    assert [s.agent.trajectory_turns for s in outcome.samples if s.agent] == [1]
