"""The agent part of the event contract: turns placed in a trajectory, and the trajectory's outcome."""

from __future__ import annotations

import pytest

from ingest.errors import InvalidEvent
from ingest.events import SCHEMA_VERSION, GenerationEvent, TrajectoryOutcomeEvent, parse_event
from tests.ingest.event_samples import GENERATION_ID, sample_event


def test_a_turn_carries_its_place_in_the_trajectory_tree() -> None:
    event = parse_event(sample_event("generation"))
    assert isinstance(event, GenerationEvent)
    assert event.payload.turn is not None
    turn = event.payload.turn
    assert (turn.agent, turn.agent_id, turn.stage, turn.boundary, turn.frozen) == (
        "orchestrator",
        "main",
        1,
        "summary",
        False,
    )
    assert str(turn.turn_id) == GENERATION_ID


def test_version_1_single_turn_events_stay_valid() -> None:
    data = sample_event("generation") | {"schema_version": 1}
    del data["payload"]["turn"], data["payload"]["trajectory"]
    event = parse_event(data)
    assert isinstance(event, GenerationEvent)
    assert event.payload.turn is None
    assert SCHEMA_VERSION == 2


def test_only_a_subagent_can_be_frozen() -> None:
    data = sample_event("generation")
    data["payload"]["turn"]["frozen"] = True
    with pytest.raises(InvalidEvent, match="only a subagent can be frozen"):
        parse_event(data)
    data["payload"]["turn"]["agent"] = "subagent"
    assert parse_event(data).payload.turn.frozen  # type: ignore[union-attr]


def test_a_turn_cannot_follow_itself() -> None:
    data = sample_event("generation")
    data["payload"]["turn"]["parent_turn_id"] = GENERATION_ID
    with pytest.raises(InvalidEvent, match="cannot follow itself"):
        parse_event(data)


@pytest.mark.parametrize(
    ("field", "value"),
    [("agent", "manager"), ("boundary", "compaction"), ("stage", -1), ("agent_id", "Sub 1")],
)
def test_turn_fields_are_checked(field: str, value: object) -> None:
    data = sample_event("generation")
    data["payload"]["turn"][field] = value
    with pytest.raises(InvalidEvent) as caught:
        parse_event(data)
    assert caught.value.field == f"payload.turn.{field}"


def test_an_outcome_scores_partial_credit_or_its_success() -> None:
    event = parse_event(sample_event("trajectory.outcome"))
    assert isinstance(event, TrajectoryOutcomeEvent)
    assert event.payload.performance == 0.75
    data = sample_event("trajectory.outcome")
    del data["payload"]["score"]
    assert parse_event(data).payload.performance == 1.0  # type: ignore[union-attr]
    data["payload"]["success"] = False
    assert parse_event(data).payload.performance == 0.0  # type: ignore[union-attr]


def test_an_outcome_names_each_subagent_once() -> None:
    data = sample_event("trajectory.outcome")
    data["payload"]["subagents"] = [{"agent_id": "sub-1", "finished": True}] * 2
    with pytest.raises(InvalidEvent, match="agent_id twice"):
        parse_event(data)


def test_an_outcome_score_lies_in_0_1() -> None:
    data = sample_event("trajectory.outcome")
    data["payload"]["score"] = 1.5
    with pytest.raises(InvalidEvent) as caught:
        parse_event(data)
    assert caught.value.field == "payload.score"
