"""The reward function: golden sessions exactly, determinism, late feedback, bounds and the loss mask."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distill.errors import InvalidSample, MisalignedTrajectory, PrivacyModeEvent
from distill.reward import counted_feedback, final_at, is_deferral, is_late, score
from distill.samples import SAMPLE_SCHEMA_VERSION, Sample, loss_mask_for, parse_sample, sample_id_for, sample_to_json
from distill.spec import RewardSpec, load_spec
from ingest.events import Event, GenerationEvent, event_to_json, parse_event
from tests.distill.golden_sessions import GENERATED_AT, GENERATION_ID, GOLDEN, Golden, feedback, generation

DEFAULT = load_spec()


def spec_with(update: dict[str, Any]) -> RewardSpec:
    return RewardSpec.model_validate({**DEFAULT.model_dump(), **update})


def parsed(golden: Golden) -> tuple[GenerationEvent, list[Event]]:
    events = [parse_event(data) for data in golden.events]
    return cast(GenerationEvent, events[0]), events[1:]


def score_golden(golden: Golden, order: list[Event] | None = None) -> Sample:
    gen, rest = parsed(golden)
    return score(gen, rest if order is None else order, spec_with(golden.spec_update), "window")


@pytest.mark.parametrize("golden", GOLDEN, ids=[g.name for g in GOLDEN])
def test_golden_session_scores_exactly_as_worked_out_by_hand(golden: Golden) -> None:
    sample = score_golden(golden)
    assert sample.components == golden.components
    assert list(sample.components) == sorted(golden.components)
    assert sample.reward == golden.reward
    assert sample.invalid_tool_calls == golden.invalid_tool_calls
    assert sample.deferral is golden.deferral
    assert len(sample.source_event_ids) == golden.counted + 1
    assert re.search(rb"-0\.0(?![0-9])", sample_to_json(sample)) is None  # no negative zero


def test_the_golden_set_covers_at_least_twelve_sessions() -> None:
    assert len(GOLDEN) >= 12
    assert len({g.name for g in GOLDEN}) == len(GOLDEN)


@pytest.mark.parametrize("golden", GOLDEN, ids=[g.name for g in GOLDEN])
def test_feedback_order_does_not_change_a_single_byte(golden: Golden) -> None:
    _, rest = parsed(golden)
    expected = sample_to_json(score_golden(golden))
    shuffled = list(rest)
    random.Random(7).shuffle(shuffled)
    assert sample_to_json(score_golden(golden, list(reversed(rest)))) == expected
    assert sample_to_json(score_golden(golden, shuffled)) == expected


def test_a_redelivered_event_gives_the_same_sample_and_id() -> None:
    golden = GOLDEN[0]
    first = score_golden(golden)
    gen, rest = parsed(golden)
    again = parse_event(event_to_json(gen))
    assert isinstance(again, GenerationEvent)
    second = score(again, [*rest, *[parse_event(event_to_json(e)) for e in rest]], DEFAULT, "window")
    assert second.sample_id == first.sample_id
    assert sample_to_json(second) == sample_to_json(first)
    expected = hashlib.sha256(f"{GENERATION_ID}:{DEFAULT.spec_hash}".encode()).hexdigest()[:32]
    assert first.sample_id == expected == sample_id_for(GENERATION_ID.upper(), DEFAULT.spec_hash)


def test_another_spec_gives_another_sample_id() -> None:
    other = spec_with({"version": "test-other"})
    assert score_golden(GOLDEN[0]).sample_id != score(*parsed(GOLDEN[0]), other, "window").sample_id


def test_sample_carries_the_generation_and_no_wall_clock() -> None:
    sample = score(*parsed(GOLDEN[0]), DEFAULT, "session_end", tokenizer="byt5")
    assert sample.generated_at == GENERATED_AT
    assert sample.finalised_by == "session_end"
    assert (sample.policy_version, sample.model, sample.tokenizer) == (3, "liveloop-tiny", "byt5")
    assert (sample.session_id, sample.user_id, sample.tenant) == ("session-golden", "user-1", "acme")
    assert sample.behaviour_logprobs == [-0.5, -0.25]
    assert sample.loss_mask == [1, 1]
    assert (sample.spec_version, sample.spec_hash) == (DEFAULT.version, DEFAULT.spec_hash)
    assert [str(i) for i in sample.source_event_ids] == sorted(str(i) for i in sample.source_event_ids)


def test_sample_json_round_trips_and_bad_bytes_are_invalid() -> None:
    sample = score_golden(GOLDEN[3])
    data = sample_to_json(sample)
    assert parse_sample(data) == sample
    assert sample_to_json(parse_sample(data)) == data
    with pytest.raises(InvalidSample, match="sample_id"):
        parse_sample(data.replace(sample.sample_id.encode(), b"0" * 32))
    newer = json.loads(data)
    newer["schema_version"] = SAMPLE_SCHEMA_VERSION + 1
    with pytest.raises(InvalidSample, match="upgrade liveloop"):
        parse_sample(json.dumps(newer))
    with pytest.raises(InvalidSample):
        parse_sample(b"{not json")


def test_source_event_ids_out_of_order_or_repeated_are_invalid() -> None:
    data = json.loads(sample_to_json(score_golden(GOLDEN[3])))
    ids = data["source_event_ids"]
    assert len(ids) >= 2
    for wrong in (ids[::-1], [*ids, ids[-1]], [ids[0], *ids]):
        with pytest.raises(InvalidSample, match="unique and sorted"):
            parse_sample(json.dumps(data | {"source_event_ids": wrong}))
    assert parse_sample(json.dumps(data)).source_event_ids == sorted(parse_sample(json.dumps(data)).source_event_ids)


def test_is_late_at_the_window_boundary() -> None:
    gen = cast(GenerationEvent, parse_event(generation()))
    on_time = parse_event(feedback(1, "tests.result", 1800, passed=1, failed=0))
    late = parse_event(feedback(2, "tests.result", 1800.000001, passed=1, failed=0))
    skewed = parse_event(feedback(3, "rating", -2, thumbs="up"))
    ended = parse_event({**feedback(4, "session.ended", 99999), "payload": {}})
    assert not is_late(gen, on_time, DEFAULT)
    assert is_late(gen, late, DEFAULT)
    assert not is_late(gen, skewed, DEFAULT)
    assert not is_late(gen, ended, DEFAULT)
    assert counted_feedback(gen, [late, on_time, skewed, ended], DEFAULT) == [skewed, on_time]
    assert final_at(gen, DEFAULT) == GENERATED_AT + timedelta(seconds=3600)


def test_privacy_mode_generation_is_never_scored() -> None:
    gen = cast(GenerationEvent, parse_event({**generation(), "privacy_mode": True}))
    with pytest.raises(PrivacyModeEvent):
        score(gen, [], DEFAULT, "window")


@pytest.mark.parametrize(
    ("surface", "task_kind", "completion", "tool_calls", "expected"),
    [
        ("ide.chat", "edit", "Which file?", [], True),
        ("agent", None, "  Should I also update the tests?\n", [], True),
        ("agent.cli", "chat", "Should I run it?", [], True),
        ("ide.chat", "chat", "Which file?", [], False),  # a chat answer may ask back
        ("ide.chat", "edit", "Here:\n```py\nx = 1\n```\nOK?", [], False),  # did the work, then asked
        ("ide.tab", "completion", "if x:\n    return y?", [], False),
        ("agent", "edit", "Done?", [{"name": "run", "arguments": "{}", "valid": True}], False),
        ("ide.chat", "edit", "Done.", [], False),
    ],
)
def test_deferral_heuristic(
    surface: str, task_kind: str | None, completion: str, tool_calls: list[dict[str, Any]], expected: bool
) -> None:
    gen = cast(
        GenerationEvent,
        parse_event(generation(surface=surface, task_kind=task_kind, completion=completion, tool_calls=tool_calls)),
    )
    assert is_deferral(gen.payload) is expected


def _trajectory_generation(
    segments: Sequence[tuple[str, list[int] | None]], tokens: list[int] | None
) -> GenerationEvent:
    trajectory = [{"role": role, "text": role, "token_ids": ids} for role, ids in segments]
    data = generation(completion_token_ids=tokens, completion_logprobs=None, trajectory=trajectory)
    return cast(GenerationEvent, parse_event(data))


def test_loss_mask_trains_only_policy_segments() -> None:
    segments = [("user", [1, 2]), ("policy", [3, 4, 5]), ("tool", [6, 7]), ("subagent", [8]), ("policy", [9])]
    gen = _trajectory_generation(segments, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    sample = score(gen, [], DEFAULT, "window")
    assert sample.loss_mask == [0, 0, 1, 1, 1, 0, 0, 0, 1]
    assert sample.completion_token_ids is not None
    assert len(sample.loss_mask) == len(sample.completion_token_ids)


def test_loss_mask_without_trajectory_or_without_tokens() -> None:
    assert loss_mask_for(cast(GenerationEvent, parse_event(generation())).payload) == [1, 1]
    plain = generation(completion_token_ids=None, completion_logprobs=None)
    assert score(cast(GenerationEvent, parse_event(plain)), [], DEFAULT, "window").loss_mask is None


@pytest.mark.parametrize(
    ("segments", "tokens"),
    [
        ([("policy", [3, 4]), ("tool", None)], [3, 4, 5]),  # a segment without token ids
        ([("policy", [3, 4]), ("tool", [6])], [3, 4, 5]),  # ids that differ from the completion's
        ([("policy", [3, 4])], [3, 4, 5]),  # too few
    ],
)
def test_misaligned_trajectory_is_refused(segments: list[tuple[str, list[int] | None]], tokens: list[int]) -> None:
    with pytest.raises(MisalignedTrajectory):
        score(_trajectory_generation(segments, tokens), [], DEFAULT, "window")


_FEEDBACK = st.one_of(
    st.builds(lambda: ("suggestion.accepted", {})),
    st.builds(lambda: ("suggestion.rejected", {})),
    st.builds(lambda: ("suggestion.dismissed", {})),
    st.builds(lambda f: ("edit.persisted", {"fraction_remaining": f, "seconds_after": 1.0}), st.floats(0, 1)),
    st.builds(lambda f: ("edit.reverted", {"fraction_remaining": f, "seconds_after": 1.0}), st.floats(0, 1)),
    st.builds(lambda d, r: ("followup", {"dissatisfied": d, "rephrase": r}), st.booleans(), st.booleans()),
    st.builds(lambda t: ("rating", {"thumbs": t}), st.sampled_from(["up", "down"])),
    st.builds(lambda p, f: ("tests.result", {"passed": p, "failed": f}), st.integers(0, 50), st.integers(0, 50)),
    st.builds(
        lambda v, i: ("tool.result", {"tool": "run", "valid": v, "call_index": i}),
        st.booleans(),
        st.none() | st.integers(0, 63),
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(st.tuples(_FEEDBACK, st.integers(-5, 4000), st.integers(1, 8)), max_size=12),
    invalid_flags=st.lists(st.none() | st.booleans(), max_size=8),
    surface=st.sampled_from(["ide.tab", "ide.chat", "agent"]),
    normalisation=st.none() | st.tuples(st.floats(0.01, 0.7), st.floats(-1.0, 0.5)),
)
def test_reward_always_lies_within_the_clip_bounds(
    items: list[tuple[tuple[str, dict[str, Any]], int, int]],
    invalid_flags: list[bool | None],
    surface: str,
    normalisation: tuple[float, float] | None,
) -> None:
    calls = [{"name": "t", "arguments": "{}", "valid": flag} for flag in invalid_flags]
    gen = cast(GenerationEvent, parse_event(generation(surface=surface, tool_calls=calls)))
    events = [parse_event(feedback(n, kind, at, **body)) for (kind, body), at, n in items]
    norms = {} if normalisation is None else {surface: {"scale": normalisation[0], "offset": normalisation[1]}}
    spec = spec_with({"surface_normalisation": norms})
    sample = score(gen, events, spec, "window")
    low, high = spec.clip
    assert low <= sample.reward <= high
    norm = spec.normalisation_for(surface)
    assert sample.reward == min(max(norm.scale * math.fsum(sample.components.values()) + norm.offset, low), high)
    assert sample_to_json(score(gen, list(reversed(events)), spec, "window")) == sample_to_json(sample)
