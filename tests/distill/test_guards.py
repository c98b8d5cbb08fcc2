"""Anti-gaming guards: one user or session cannot dominate, invalid tool calls always cost, deferral is watched."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import cast

from distill.guards import (
    DeferralStats,
    UserWindow,
    admit_session,
    admit_user,
    dedupe_key,
)
from distill.reward import score
from distill.spec import Guards, load_spec
from ingest.events import GenerationEvent, parse_event
from tests.distill.golden_sessions import feedback, generation

SPEC = load_spec()
START = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def test_one_user_sending_half_the_traffic_is_capped() -> None:
    guards = Guards(max_samples_per_user_per_window=20, user_window_s=3600, max_samples_per_session=10**6)
    states: dict[str, UserWindow] = {}
    admitted: dict[str, list[datetime]] = {}
    offered = 0
    # Ten hours, one sample every 2 s: every other one from the same user, the rest spread over 300 users.
    for n in range(18_000):
        user = "whale" if n % 2 == 0 else f"user-{(n // 2) % 300}"
        at = START + timedelta(seconds=2 * n)
        ok, states[user] = admit_user(states.get(user), at, guards)
        offered += user == "whale"
        if ok:
            admitted.setdefault(user, []).append(at)
    whale = admitted["whale"]
    others = sum(len(times) for user, times in admitted.items() if user != "whale")
    assert offered == 9_000
    assert others == 9_000  # 30 each over ten hours: far below the cap, nobody else is touched
    assert len(whale) == 200  # 20 in each of ten hours
    assert len(whale) / (len(whale) + others) < 0.025  # from 50 % of the traffic to about 2 %
    for i, at in enumerate(whale):  # never more than the cap in any sliding window
        assert sum(1 for t in whale[i:] if t - at < timedelta(seconds=3600)) <= 20


def test_a_refused_flood_does_not_lock_the_user_out_after_the_window() -> None:
    guards = Guards(max_samples_per_user_per_window=2, user_window_s=60, max_samples_per_session=10)
    state = None
    decisions = []
    for seconds in (0, 1, 2, 3, 59, 60, 61):
        ok, state = admit_user(state, START + timedelta(seconds=seconds), guards)
        decisions.append(ok)
    # 0 and 1 admitted; refused until 0 leaves the window (at 60), then 1 leaves it at 61.
    assert decisions == [True, True, False, False, False, True, True]
    assert state is not None
    assert UserWindow.model_validate_json(state.model_dump_json()) == state


def test_one_session_is_capped() -> None:
    guards = Guards(max_samples_per_user_per_window=100, user_window_s=60, max_samples_per_session=3)
    count, decisions = 0, []
    for _ in range(5):
        ok, count = admit_session(count, guards)
        decisions.append(ok)
    assert decisions == [True, True, True, False, False]
    assert count == 3


def test_dedupe_key_is_scoped_by_tenant() -> None:
    event = parse_event(feedback(1, "suggestion.accepted", 5))
    again = parse_event(feedback(1, "suggestion.accepted", 5))
    other_tenant = parse_event({**feedback(1, "suggestion.accepted", 5), "tenant": "evil"})
    assert dedupe_key(event) == dedupe_key(again) == f"acme:{event.event_id}"
    assert dedupe_key(other_tenant) != dedupe_key(event)


def _generation(calls: int, valid: bool | None) -> GenerationEvent:
    tool_calls = [{"name": "edit", "arguments": "{", "valid": valid} for _ in range(calls)]
    return cast(GenerationEvent, parse_event(generation(surface="agent", task_kind="edit", tool_calls=tool_calls)))


def test_a_flood_of_invalid_tool_calls_is_penalised_never_neutral() -> None:
    silent = score(_generation(0, None), [], SPEC, "window").reward
    flood = score(_generation(64, False), [], SPEC, "window")
    assert flood.invalid_tool_calls == 64
    assert flood.components["invalid_tool_call"] == -64.0
    assert flood.reward == SPEC.clip[0] < silent
    # Invalid calls reported only by the tool runner, without indices, count one by one.
    runner = [feedback(n, "tool.result", 1, tool="edit", valid=False) for n in range(1, 11)]
    reported = score(_generation(0, None), [parse_event(e) for e in runner], SPEC, "window")
    assert reported.invalid_tool_calls == 10
    assert reported.reward < silent
    # Even the best possible outcome drops with a single invalid call: clipping cannot hide it.
    best = [
        feedback(1, "suggestion.accepted", 5),
        feedback(2, "edit.persisted", 60, fraction_remaining=1.0, seconds_after=55),
        feedback(3, "rating", 70, thumbs="up"),
        feedback(4, "tests.result", 80, passed=5, failed=0),
    ]
    events = [parse_event(e) for e in best]
    perfect = score(_generation(1, True), events, SPEC, "window").reward
    one_invalid = score(_generation(1, False), events, SPEC, "window").reward
    assert one_invalid < perfect == SPEC.clip[1]
    # Unchecked calls (valid=None) are not penalised: only evidence of invalidity counts.
    assert score(_generation(3, None), [], SPEC, "window").invalid_tool_calls == 0


def test_deferral_rate_per_policy_version() -> None:
    stats = DeferralStats()
    assert stats.rate(1) is None
    for deferral in (True, False, False, False):
        stats.record(1, deferral)
    for deferral in (True, True, False, True, False):
        stats.record(2, deferral)
    assert stats.rate(1) == 0.25
    assert stats.rate(2) == 0.6
    assert stats.rate(3) is None
    assert DeferralStats.model_validate_json(stats.model_dump_json()) == stats


def test_deferral_stats_fed_from_samples() -> None:
    stats = DeferralStats()
    asking = parse_event(generation(surface="ide.chat", task_kind="edit", completion="Which file?"))
    working = parse_event(generation(surface="ide.chat", task_kind="edit", completion="Done."))
    for event in (asking, working, working):
        sample = score(cast(GenerationEvent, event), [], SPEC, "window")
        stats.record(sample.policy_version, sample.deferral)
    assert stats.rate(3) == 1 / 3
