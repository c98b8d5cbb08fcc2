"""Feedback that can never join its generation is given up with a reason, never dropped silently, and a
generation finalised with no feedback is counted (liveloop issue 37: a backend sent its feedback under
its own session while the gateway had filed the generations under sessions it invented)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from distill.deadlines import DeadlineIndex
from distill.sessions import MAX_ORPHANS, ORPHAN_GRACE_S, SessionState, apply_event, apply_tick, expired
from distill.spec import load_spec
from ingest.events import Event, parse_event
from tests.distill.stream_harness import ended, feedback, generation

SPEC = load_spec()
T0 = datetime(2026, 11, 2, 10, 0, 0, tzinfo=UTC)
NOW = T0.timestamp()


def _event(raw: dict[str, object]) -> Event:
    return parse_event(raw)


def _ended_session_with_orphan() -> tuple[SessionState, str]:
    """The backend's own session: an accept for a generation filed elsewhere, then the session's end."""
    state = SessionState()
    generation_id = str(uuid.uuid4())
    apply_event(state, _event(feedback("suggestion.accepted", "backend-1", generation_id, ts=T0)), SPEC, NOW)
    apply_event(state, _event(ended("backend-1", ts=T0 + timedelta(seconds=5))), SPEC, NOW + 5)
    return state, generation_id


def test_an_ended_sessions_orphan_is_given_up_with_an_actionable_reason_after_the_grace() -> None:
    state, generation_id = _ended_session_with_orphan()
    early = apply_tick(state, datetime.fromtimestamp(NOW + 5 + ORPHAN_GRACE_S - 1, UTC), SPEC)
    assert (early.unjoined, len(state.orphans)) == ([], 1), "its generation may still be on its way"
    outcome = apply_tick(state, datetime.fromtimestamp(NOW + 5 + ORPHAN_GRACE_S, UTC), SPEC)
    [(event, reason)] = outcome.unjoined
    assert str(event.payload.generation_id) == generation_id  # type: ignore[union-attr]
    assert f"generation {generation_id}" in reason
    assert "session backend-1 never had" in reason
    assert "X-Liveloop-Session" in reason
    assert state.orphans == []


def test_the_deadline_index_ticks_an_ended_session_when_its_orphans_are_due() -> None:
    state, _ = _ended_session_with_orphan()
    index = DeadlineIndex(SPEC, settled_after_s=60.0)
    index.update(b"backend-1", 0, state)
    assert index.due(0, NOW + 5 + ORPHAN_GRACE_S) == [b"backend-1"]


def test_an_orphan_whose_generation_arrives_after_the_sessions_end_still_joins() -> None:
    """The gateway's generation event and the backend's feedback take separate paths: the feedback and the
    session's end may come first. Within the grace the generation collects its feedback."""
    state, generation_id = _ended_session_with_orphan()
    outcome = apply_event(state, _event(generation("backend-1", generation_id, ts=T0)), SPEC, NOW + 10)
    [sample] = outcome.samples
    assert sample.reward == 0.75
    assert outcome.without_feedback == 0
    assert outcome.unjoined == []
    assert apply_tick(state, datetime.fromtimestamp(NOW + 10 + ORPHAN_GRACE_S, UTC), SPEC).unjoined == []


def test_orphans_of_a_quiet_session_are_given_up_before_it_expires() -> None:
    state = SessionState()
    apply_event(state, _event(feedback("rating", "s", uuid.uuid4(), ts=T0, thumbs="up")), SPEC, NOW)
    later = NOW + SPEC.windows_s.longest + 1
    assert not expired(state, later, SPEC), "a session holding orphans is never deleted with them"
    assert len(apply_tick(state, datetime.fromtimestamp(later, UTC), SPEC).unjoined) == 1
    assert expired(state, later, SPEC)


def test_an_orphan_over_the_limit_is_given_up_at_once() -> None:
    state = SessionState()
    for _ in range(MAX_ORPHANS):
        apply_event(state, _event(feedback("suggestion.accepted", "s", uuid.uuid4(), ts=T0)), SPEC, NOW)
    outcome = apply_event(state, _event(feedback("suggestion.accepted", "s", uuid.uuid4(), ts=T0)), SPEC, NOW)
    [(_, reason)] = outcome.unjoined
    assert f"{MAX_ORPHANS} feedback events" in reason


def test_a_private_sessions_orphans_are_dropped_not_given_up() -> None:
    state, _ = _ended_session_with_orphan()
    private = ended("backend-1", ts=T0 + timedelta(seconds=6), privacy_mode=True)
    assert apply_event(state, _event(private), SPEC, NOW + 6).private
    assert apply_tick(state, datetime.fromtimestamp(NOW + 6 + ORPHAN_GRACE_S, UTC), SPEC).unjoined == []


def test_a_generation_finalised_without_feedback_is_counted() -> None:
    state = SessionState()
    apply_event(state, _event(generation("gateway-x", uuid.uuid4(), ts=T0)), SPEC, NOW)
    with_feedback = uuid.uuid4()
    apply_event(state, _event(generation("gateway-x", with_feedback, ts=T0)), SPEC, NOW)
    apply_event(state, _event(feedback("suggestion.accepted", "gateway-x", with_feedback, ts=T0)), SPEC, NOW)
    outcome = apply_event(state, _event(ended("gateway-x", ts=T0 + timedelta(seconds=5))), SPEC, NOW + 5)
    assert len(outcome.samples) == 2
    assert outcome.without_feedback == 1
