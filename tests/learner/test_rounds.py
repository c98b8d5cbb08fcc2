"""The round journal and round planning: what makes a replay train exactly what the first attempt trained."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from distill.samples import CreditedSpan
from learner.baseline import EmaBaseline, bucket_of
from learner.manifest import OffsetRange
from learner.rounds import (
    JOURNAL_FILE,
    CheckpointEntry,
    RebaseEntry,
    RoundEntry,
    RoundJournal,
    plan_round,
    round_ranges,
    unit_weights,
)
from learner.settings import LearnerSettings
from learner.shaping import ShapingSchedule
from learner.tiny_model import byte_tokenizer
from tests.learner.sample_factory import make_agent_sample, make_sample

NO_SHAPING = ShapingSchedule(lambda_parallel=0.0, lambda_finish=0.0, anneal_steps=0)


def _round(number: int, parent: str, first: int, last: int) -> RoundEntry:
    return RoundEntry(
        round=number, parent=parent, ranges=[OffsetRange(topic="t", partition=0, first_offset=first, last_offset=last)]
    )


def test_the_journal_survives_reopening_and_answers_what_follows_a_checkpoint(tmp_path: Path) -> None:
    journal = RoundJournal(tmp_path)
    r1, r2 = _round(1, "m-v00000", 0, 9), _round(2, "m-v00000", 10, 12)
    c1 = CheckpointEntry(checkpoint_id="m-v00001", parent="m-v00000", after_round=2)
    r3 = _round(3, "m-v00001", 13, 20)
    for entry in (r1, r2, c1, r3):
        journal.append(entry)
    reopened = RoundJournal(tmp_path)
    assert reopened.entries == [r1, r2, c1, r3]
    assert reopened.after("m-v00000") == [r1, r2, c1, r3]  # the base has no entry of its own
    assert reopened.after("m-v00001") == [r3]


def test_a_rebase_and_a_checkpoint_naming_its_reference_read_back_in_order(tmp_path: Path) -> None:
    journal = RoundJournal(tmp_path)
    r4 = _round(4, "m-v00003", 30, 37)
    rebase = RebaseEntry(parent="m-v00003", left="m-v00003", onto="m-v00002", onto_version=2)
    c4 = CheckpointEntry(
        checkpoint_id="m-v00004", parent="m-v00003", after_round=5, policy_version=4, reference_id="m-v00002"
    )
    for entry in (r4, rebase, _round(5, "m-v00003", 38, 45), c4):
        journal.append(entry)
    reopened = RoundJournal(tmp_path)
    assert reopened.entries[1] == rebase
    assert reopened.after("m-v00004") == []
    assert reopened.entries[3] == c4


def test_compaction_forgets_what_precedes_a_complete_checkpoint_and_keeps_what_follows(tmp_path: Path) -> None:
    journal = RoundJournal(tmp_path)
    r1, r2 = _round(1, "m-v00000", 0, 9), _round(2, "m-v00000", 10, 12)
    c1 = CheckpointEntry(checkpoint_id="m-v00001", parent="m-v00000", after_round=2)
    r3 = _round(3, "m-v00001", 13, 20)
    for entry in (r1, r2, c1, r3):
        journal.append(entry)
    journal.compact("m-v00001")
    reopened = RoundJournal(tmp_path)
    assert reopened.entries == [c1, r3]
    assert reopened.after("m-v00001") == [r3]  # a restart from checkpoint 1 replays exactly the same
    journal.compact("m-v00009")  # an unknown checkpoint: nothing is forgotten
    assert RoundJournal(tmp_path).entries == [c1, r3]
    assert len((tmp_path / JOURNAL_FILE).read_bytes().splitlines()) == 2


def test_a_torn_last_line_is_dropped_and_the_journal_stays_appendable(tmp_path: Path) -> None:
    journal = RoundJournal(tmp_path)
    r1 = _round(1, "m-v00000", 0, 9)
    journal.append(r1)
    with (tmp_path / JOURNAL_FILE).open("ab") as handle:
        handle.write(b'{"kind":"round","round":2,"par')  # the process died inside the write
    reopened = RoundJournal(tmp_path)
    assert reopened.entries == [r1]
    r2 = _round(2, "m-v00000", 10, 11)
    reopened.append(r2)
    assert RoundJournal(tmp_path).entries == [r1, r2]


def test_a_damaged_line_in_the_middle_is_an_error_not_silently_skipped(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_FILE).write_bytes(b"not json\n" + _round(1, "m", 0, 1).model_dump_json().encode() + b"\n")
    with pytest.raises(ValueError, match="Invalid JSON"):
        RoundJournal(tmp_path)


def test_round_ranges_run_from_the_previous_position_to_the_last_offset_read() -> None:
    ranges = round_ranges("t", {0: 10, 1: 4, 2: 7}, {1: 9, 0: 12})
    assert [(r.partition, r.first_offset, r.last_offset) for r in ranges] == [(0, 10, 12), (1, 4, 9)]


def test_plan_round_packs_by_tokens_and_takes_advantages_before_each_batch_updates_the_baseline() -> None:
    # Each sample: 3 prompt + 2 completion tokens = 5; a budget of 10 packs them in twos.
    samples = [make_sample(n, reward=r, task_kind="edit") for n, r in enumerate([1.0, 0.0, 0.5, -1.0, 0.25])]
    baseline = EmaBaseline(decay=0.5)
    steps = plan_round(samples, baseline, token_budget=10, shaping=NO_SHAPING, first_step=0)
    assert [len(step) for step in steps] == [2, 2, 1]
    # Batch 1: baseline 0 (never seen) -> raw advantages [1, 0] -> normalised [1, -1] (std 0.5).
    assert steps[0].advantages == pytest.approx([1.0, -1.0], abs=1e-5)
    # Then b = 1 (first reward sets it), then 0.5 * 1 + 0.5 * 0 = 0.5.
    # Batch 2: raw [0.5 - 0.5, -1 - 0.5] = [0, -1.5] -> normalised [1, -1].
    assert steps[1].advantages == pytest.approx([1.0, -1.0], abs=1e-5)
    # Then b = 0.5 * 0.5 + 0.25 = 0.5, then 0.5 * 0.5 - 0.5 = -0.25. Batch 3: one sample -> 0.
    assert steps[2].advantages == [0.0]
    assert baseline.value("task:edit") == pytest.approx(0.5 * -0.25 + 0.5 * 0.25)
    assert steps[0].prompt_ids == [[10, 11, 12], [10, 11, 12]]
    assert steps[0].loss_mask == [[1, 1], [1, 1]]


def test_unit_weighting_gives_every_unit_the_same_share_of_the_step_loss() -> None:
    short = make_sample(1, reward=1.0, completion_token_ids=[20, 21])
    long = make_sample(2, reward=0.0, completion_token_ids=list(range(20, 28)))
    by_token = plan_round([short, long], EmaBaseline(), 100, shaping=NO_SHAPING, first_step=0)[0]
    by_unit = plan_round([short, long], EmaBaseline(), 100, shaping=NO_SHAPING, first_step=0, weighting="unit")[0]
    assert by_token.advantages == pytest.approx([1.0, -1.0], abs=1e-5)
    # Mean policy tokens 5: the short answer's advantage is scaled by 5/2, the long one's by 5/8, so that each
    # answer's advantage summed over its tokens is the same size (the token-mean loss weighs them alike).
    assert by_unit.advantages == pytest.approx([2.5, -0.625], abs=1e-5)
    sums = [a * sum(mask) for a, mask in zip(by_unit.advantages, by_unit.loss_mask, strict=True)]
    assert sums == pytest.approx([5.0, -5.0], abs=1e-4)
    # A trajectory is one unit: its turns' tokens count together, and every turn takes the unit's weight.
    turns = [make_agent_sample(n, 7, n, 2, completion_token_ids=[20, 21]) for n in (3, 4)]
    silent = make_sample(5, loss_mask=[0, 0])  # no policy token: it trains nothing, and moves no one's weight
    assert unit_weights([turns, [long], [silent]]) == [1.5, 0.75, 0.0]
    assert unit_weights([[silent]]) == [0.0]


def test_a_turns_own_check_moves_its_advantage_and_the_trajectory_still_weighs_once() -> None:
    # Trajectory 7: two turns sharing reward 1.0, the second checked on its own (+1.0); a single-turn sample at 0.
    turns = [make_agent_sample(n, 7, n, 2, reward=r) for n, r in ((1, 1.0), (2, 2.0))]
    single = make_sample(3, reward=0.0)
    baseline = EmaBaseline()
    step = plan_round([*turns, single], baseline, 100, shaping=NO_SHAPING, first_step=0)[0]
    # Each turn weighs 1/2: mean (0.5 * 1 + 0.5 * 2 + 0) / 2 = 0.75, population variance 0.6875.
    std = 0.6875**0.5 + 1e-6
    assert step.advantages == pytest.approx([0.25 / std, 1.25 / std, -0.75 / std], abs=1e-9)
    # The baseline takes the trajectory's mean reward, once.
    assert baseline.value(bucket_of(turns[0])) == 1.5
    # Turns sharing their reward share the advantage the trajectory had before per-turn checks.
    shared = [make_agent_sample(n, 8, n, 2, reward=1.0) for n in (4, 5)]
    plain = plan_round([*shared, single], EmaBaseline(), 100, shaping=NO_SHAPING, first_step=0)[0]
    assert plain.advantages == pytest.approx([1.0, 1.0, -1.0], abs=1e-5)


def test_credited_spans_move_their_own_tokens_on_the_normalisation_scale_past_the_floor() -> None:
    tokenizer = byte_tokenizer()
    text = "A=1 B=2"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    spans = (CreditedSpan(start=0, end=3, credit=0.5), CreditedSpan(start=4, end=7, credit=-0.5))
    # Two single-turn trajectories, rewards 1 and 0: normalised advantages +1 and -1, spread 0.5.
    checked = make_agent_sample(1, 7, 1, 1, reward=1.0, completion_token_ids=ids, completion=text, spans=spans)
    other = make_agent_sample(2, 8, 1, 1, reward=0.0, completion_token_ids=ids, completion=text)
    step = plan_round([checked, other], EmaBaseline(), 100, shaping=NO_SHAPING, first_step=0, tokenizer=tokenizer)[0]
    assert step.advantages == pytest.approx([1.0, -1.0], abs=1e-5)
    spread = 0.5 + 1e-6
    assert step.token_credit is not None
    assert step.token_credit[0] == pytest.approx([0.5 / spread] * 3 + [0.0] + [-0.5 / spread] * 3)
    assert step.token_credit[1] == []
    # The floor takes the sample's advantage to 0, not its spans' credit: a failed fact is charged still.
    floored = plan_round(
        [other, checked], EmaBaseline(), 100, shaping=NO_SHAPING, first_step=0, min_advantage=0.0, tokenizer=tokenizer
    )[0]
    assert floored.advantages == pytest.approx([0.0, 1.0], abs=1e-5)
    assert floored.token_credit is not None
    assert min(floored.token_credit[1]) == pytest.approx(-0.5 / spread)
    # Without a tokenizer (or spans) the batch carries no token credit: what every batch did before.
    assert plan_round([checked, other], EmaBaseline(), 100, shaping=NO_SHAPING, first_step=0)[0].token_credit is None


def test_unit_weighting_is_hashed_into_the_training_config_only_away_from_its_default() -> None:
    # Checkpoints written before the setting existed keep their hash: 'token' adds nothing to the config.
    assert "loss_weighting" not in LearnerSettings().training_config()
    assert LearnerSettings.model_validate({"loss_weighting": "unit"}).training_config()["loss_weighting"] == "unit"
    with pytest.raises(ValidationError):
        LearnerSettings.model_validate({"loss_weighting": "sequence"})


def test_the_advantage_floor_trains_only_the_answers_better_than_their_baseline() -> None:
    samples = [make_sample(n, reward=r) for n, r in enumerate([1.0, 0.0, 0.5, 0.5])]
    free = plan_round(samples, EmaBaseline(), 100, shaping=NO_SHAPING, first_step=0)[0]
    floored = plan_round(samples, EmaBaseline(), 100, shaping=NO_SHAPING, first_step=0, min_advantage=0.0)[0]
    assert min(free.advantages) < 0
    # Below the baseline an answer trains with weight 0; above it, by as much as without the floor.
    assert floored.advantages == pytest.approx([max(a, 0.0) for a in free.advantages], abs=1e-6)
    assert floored.advantages[0] > 0
    assert floored.advantages[1] == 0.0


def test_passes_over_a_round_need_the_clip_and_both_new_settings_are_hashed_only_away_from_their_defaults() -> None:
    defaults = LearnerSettings().training_config()
    assert "epochs" not in defaults  # older checkpoints keep their hash
    assert "min_advantage" not in defaults
    config = LearnerSettings.model_validate({"epochs": 2, "clip_eps": 0.2, "min_advantage": 0}).training_config()
    assert (config["epochs"], config["min_advantage"], config["clip_eps"]) == (2, 0.0, 0.2)
    with pytest.raises(ValidationError, match="LIVELOOP_LEARNER_CLIP_EPS"):
        LearnerSettings.model_validate({"epochs": 2})
    with pytest.raises(ValidationError):
        LearnerSettings.model_validate({"min_advantage": 0.5})  # a floor above 0 would train below-baseline answers
