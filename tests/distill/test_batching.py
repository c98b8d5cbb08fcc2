"""The pieces the batched agents rely on, without Faust: session state kept in memory between the
events of a batch scores exactly like state stored and reloaded after every event, and the per-user
admission state passes repeats without spending the cap and survives its table encoding."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from distill.admission import UserAdmissions
from distill.samples import Sample, sample_to_json
from distill.sessions import SessionState, apply_event
from distill.spec import Guards, load_spec
from ingest.events import parse_event
from tests.distill.golden_sessions import GENERATED_AT, GOLDEN, Golden, envelope

SPEC = load_spec()
NOW = GENERATED_AT.timestamp()


def _session(golden: Golden) -> list[bytes]:
    """The golden's events (less a privacy-mode one, which the SDK drops) and the session's end an hour
    later (so every generation is final), as JSON."""
    end = envelope(900, "session.ended", 3700, {"reason": "closed"})
    events = [event for event in [*golden.events, end] if not event.get("privacy_mode")]
    return [parse_event(event).model_dump_json().encode() for event in events]


def _stream(raw: list[bytes], reload_every_event: bool) -> list[Sample]:
    state = SessionState()
    samples: list[Sample] = []
    for value in raw:
        if reload_every_event:
            state = SessionState.load(state.dump())
        samples += apply_event(state, parse_event(value), SPEC, NOW).samples
    return samples


@pytest.mark.parametrize("golden", [g for g in GOLDEN if not g.spec_update], ids=lambda g: g.name)
def test_state_kept_in_memory_scores_like_state_reloaded_after_every_event(golden: Golden) -> None:
    """A batch keeps a session's parsed events in memory; per-event processing stored the state and
    parsed it back each time. Both give the same sample, byte for byte, and the golden reward."""
    raw = _session(golden)
    in_memory = _stream(raw, reload_every_event=False)
    reloaded = _stream(raw, reload_every_event=True)
    assert [sample_to_json(s) for s in in_memory] == [sample_to_json(s) for s in reloaded]
    [sample] = in_memory
    assert (sample.reward, sample.components) == (golden.reward, golden.components)


def test_session_state_round_trips_through_its_table_bytes() -> None:
    """What the table stores (``dump``) loads back to the same state, pending generation included."""
    state = SessionState()
    for event in GOLDEN[0].events:
        apply_event(state, parse_event(event), SPEC, NOW)
    assert state.pending, "the golden's generation waits for its session to end"
    loaded = SessionState.load(state.dump())
    assert loaded.model_dump() == state.model_dump()
    assert loaded.dump() == state.dump()
    assert SessionState.load(None) == SessionState()


def _sample(number: int, user: str, at: datetime) -> Sample:
    """A valid sample of ``user`` at ``at`` (the golden accepted-only generation under another id)."""
    golden = GOLDEN[0]
    generation = dict(golden.events[0])
    generation["payload"] = {**generation["payload"], "generation_id": f"00000000-0000-4000-8000-{number:012x}"}
    generation["user_id"] = user
    generation["ts"] = at.isoformat().replace("+00:00", "Z")
    state = SessionState()
    apply_event(state, parse_event(generation), SPEC, NOW)
    end = envelope(900, "session.ended", 1, {"reason": "closed"})
    [sample] = apply_event(state, parse_event(end), SPEC, NOW).samples
    return sample


def test_user_admissions_cap_a_user_and_pass_repeats_without_spending_the_cap() -> None:
    guards = Guards(max_samples_per_user_per_window=3, user_window_s=3600, max_samples_per_session=100)
    start = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    samples = [_sample(n, "whale", start + timedelta(seconds=n)) for n in range(5)]
    admissions = UserAdmissions()
    decisions = [admissions.admit(sample, guards) for sample in samples]
    assert decisions == [True, True, True, False, False]
    # A repeat of an admitted sample (an outbox published again after a restart) goes on again,
    # and the state survives the table's encoding in between.
    admissions = UserAdmissions.load(admissions.dump())
    assert admissions.admit(samples[1], guards)
    assert not admissions.admit(samples[4], guards)
    assert admissions.admitted_ids == [s.sample_id for s in samples[:3]]
    # An hour later the window has moved on.
    later = _sample(99, "whale", start + timedelta(seconds=3700))
    assert admissions.admit(later, guards)
