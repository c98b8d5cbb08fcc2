"""Agent trajectories as units: the shaping schedule, packing that never splits a trajectory, the hold that waits for
a trajectory's last turn (bounded), and the manifest and state that record both."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from distill.samples import HeldOutRule
from learner.baseline import EmaBaseline
from learner.checkpoint import CycleRecord, build_manifest
from learner.intake import pack_batches, training_units
from learner.manifest import MANIFEST_SCHEMA_VERSION, CheckpointManifest
from learner.rounds import plan_round
from learner.settings import LearnerSettings
from learner.shaping import ShapingRecord, ShapingSchedule
from learner.state import TrainingState
from learner.trajectories import TrajectoryHold
from tests.learner.sample_factory import make_agent_sample, make_sample


def test_the_coefficients_fall_linearly_to_zero_and_stay_there() -> None:
    schedule = ShapingSchedule(lambda_parallel=0.4, lambda_finish=0.2, anneal_steps=8)
    assert schedule.at(0) == (0.4, 0.2)
    assert schedule.at(2) == pytest.approx((0.3, 0.15))
    assert schedule.at(8) == schedule.at(1000) == (0.0, 0.0)
    assert ShapingSchedule(lambda_parallel=0.4, lambda_finish=0.2, anneal_steps=0).at(0) == (0.0, 0.0)
    with pytest.raises(ValueError, match="step -1 must be >= 0"):
        schedule.at(-1)
    turn = make_agent_sample(1, 1, 1, 1, reward=0.5, r_parallel=1.0, r_finish=0.5)
    assert schedule.shaped_reward(turn, 2) == pytest.approx(0.5 + 0.3 + 0.075)
    assert schedule.shaped_reward(make_sample(2, reward=0.5), 0) == 0.5  # single-turn samples: unchanged


def test_settings_bound_the_schedule_and_the_wait_and_hash_them() -> None:
    for bad in ({"lambda_parallel": -0.1}, {"lambda_finish": 11.0}, {"lambda_anneal_steps": -1}):
        with pytest.raises(ValidationError):
            LearnerSettings.model_validate(bad)
    with pytest.raises(ValidationError):
        LearnerSettings.model_validate({"trajectory_wait_rounds": 1001})
    settings = LearnerSettings.model_validate({"lambda_parallel": 0.3, "lambda_anneal_steps": 50})
    assert settings.shaping() == ShapingSchedule(lambda_parallel=0.3, lambda_finish=0.2, anneal_steps=50)
    config = settings.training_config()
    assert (config["lambda_parallel"], config["lambda_anneal_steps"], config["trajectory_wait_rounds"]) == (0.3, 50, 8)


def test_packing_keeps_each_trajectory_whole_and_in_one_batch() -> None:
    # Off two partitions: trajectory 1's and 2's turns interleave with single-turn samples. 5 tokens each.
    a = [make_agent_sample(n, 1, n, 3) for n in (1, 4, 6)]
    b = [make_agent_sample(n, 2, n, 2) for n in (3, 5)]
    s1, s2 = make_sample(2), make_sample(7)
    stream = [a[0], s1, b[0], a[1], b[1], a[2], s2]
    assert training_units(stream) == [a, [s1], b, [s2]]
    batches = pack_batches(stream, token_budget=10)  # a 15-token trajectory over a 10-token budget: alone
    assert batches == [a, [s1], b, [s2]]
    assert pack_batches(stream, token_budget=20) == [[*a, s1], [*b, s2]]


def test_each_batch_is_shaped_at_its_own_step_and_updates_the_baseline_once_per_trajectory() -> None:
    schedule = ShapingSchedule(lambda_parallel=1.0, lambda_finish=0.0, anneal_steps=4)
    a = [make_agent_sample(n, 1, n, 3, reward=0.2, r_parallel=1.0) for n in range(3)]
    b = [make_agent_sample(n, 2, n, 2, reward=-0.4, r_parallel=1.0) for n in range(3, 5)]
    baseline = EmaBaseline(decay=0.5)
    steps = plan_round([*a, *b], baseline, token_budget=15, shaping=schedule, first_step=2)
    assert [len(step) for step in steps] == [3, 2]
    # Batch 0 trains at step 2 (lambda 0.5), batch 1 at step 3 (0.25); one EMA update per trajectory:
    # b = 0.2 + 0.5, then 0.5 * 0.7 + 0.5 * (-0.4 + 0.25).
    assert baseline.value("surface:agent") == pytest.approx(0.5 * 0.7 + 0.5 * -0.15)


def _offer_all(hold: TrajectoryHold, samples: list, admitted: bool = True) -> list:
    return [released for sample in samples for released in hold.offer(sample, admitted)]


def test_the_hold_releases_a_trajectory_when_its_last_turn_arrives_even_rounds_later() -> None:
    turns = [make_agent_sample(n, 1, n, 3) for n in range(3)]
    single = make_sample(10)
    hold = TrajectoryHold(wait_rounds=2)
    assert _offer_all(hold, [turns[0], single, turns[1]]) == [single]  # the single-turn sample trains now
    assert hold.end_round() == []
    assert (len(hold), hold.held_samples()) == (1, 2)
    assert _offer_all(hold, [turns[1]]) == []  # a re-delivered turn is not another turn
    assert hold.end_round() == []
    assert hold.offer(turns[2], admitted=True) == turns
    assert (len(hold), hold.counts) == (0, {"complete": 1, "incomplete": 0})


def test_a_dropped_turn_counts_as_arrived_and_a_frozen_one_does_not() -> None:
    turns = [make_agent_sample(n, 1, n, 3) for n in range(3)]
    frozen = make_agent_sample(9, 1, 9, 3, frozen=True, agent="subagent")
    hold = TrajectoryHold(wait_rounds=5)
    assert hold.offer(turns[0], admitted=True) == []
    assert hold.offer(frozen, admitted=False) == []  # not one of the 3 trainable turns
    assert hold.offer(turns[1], admitted=False) == []  # held out, say: arrived, not trained
    assert hold.offer(turns[2], admitted=True) == [turns[0], turns[2]]
    assert hold.offer(make_sample(5), admitted=False) == []


def test_a_trajectory_that_never_completes_trains_as_it_is_after_the_wait_and_is_counted() -> None:
    turns = [make_agent_sample(n, 1, n, 4) for n in range(2)]
    hold = TrajectoryHold(wait_rounds=2)
    assert _offer_all(hold, turns) == []
    assert hold.end_round() == []  # waited 1 round
    assert hold.end_round() == []  # waited 2
    assert hold.end_round() == turns
    assert (len(hold), hold.counts) == (0, {"complete": 0, "incomplete": 1})
    no_wait = TrajectoryHold(wait_rounds=0)
    assert _offer_all(no_wait, turns) == []
    assert no_wait.end_round() == turns
    nothing = TrajectoryHold(wait_rounds=0)
    nothing.offer(turns[0], admitted=False)
    assert nothing.end_round() == []
    assert nothing.counts == {"complete": 0, "incomplete": 0}


def test_the_held_trajectories_survive_the_training_state_and_restart_where_they_were() -> None:
    turns = [make_agent_sample(n, 1, n, 3) for n in range(3)]
    hold = TrajectoryHold(wait_rounds=3)
    _offer_all(hold, turns[:2])
    hold.end_round()
    state = TrainingState(
        checkpoint_id="m-v00002",
        policy_version=2,
        step=4,
        round=2,
        positions={0: 9},
        baseline={},
        seen_sample_ids=[t.sample_id for t in turns[:2]],
        checkpoint_sample_ids=[],
        checkpointed_at=datetime(2026, 1, 1, tzinfo=UTC),
        held_trajectories=hold.state(),
    )
    restored = TrainingState.model_validate_json(state.model_dump_json())
    assert restored == state
    again = TrajectoryHold(3, restored.held_trajectories)
    assert again.offer(turns[2], admitted=True) == turns
    assert restored.held_trajectories[0].samples == turns[:2]  # the state itself is left as it was (rebase)
    assert restored.held_trajectories[0].rounds_waited == 1
    older = state.model_dump(mode="json")
    del older["held_trajectories"]
    assert TrainingState.model_validate(older).held_trajectories == []


def test_every_manifest_records_the_schedule_and_where_it_stood(tmp_path: Path) -> None:
    settings = LearnerSettings.model_validate(
        {"data_dir": tmp_path, "lambda_parallel": 0.5, "lambda_finish": 0.25, "lambda_anneal_steps": 40}
    )
    manifest = build_manifest(
        settings=settings,
        base_label="tiny",
        checkpoint_id="m-v00003",
        parent_id="m-v00002",
        policy_version=3,
        step=10,
        cycle=CycleRecord(),
        positions={},
        files={"model.safetensors": "0" * 64},
        held_out=HeldOutRule(percent=10),
    )
    schedule = ShapingSchedule(lambda_parallel=0.5, lambda_finish=0.25, anneal_steps=40)
    assert manifest.schema_version == MANIFEST_SCHEMA_VERSION == 4
    assert manifest.shaping == ShapingRecord(schedule=schedule, lambda_parallel=0.375, lambda_finish=0.1875)
    assert manifest.training_config["lambda_anneal_steps"] == 40  # and so in the hashed config
    read = CheckpointManifest.model_validate_json(manifest.model_dump_json())
    assert read.shaping == manifest.shaping
    # A schema 3 manifest, written before the schedule was recorded, still reads.
    older = manifest.model_dump(mode="json")
    del older["shaping"]
    older["schema_version"] = 3
    assert CheckpointManifest.model_validate(older).shaping is None


def test_the_held_out_split_takes_or_leaves_a_trajectory_whole() -> None:
    # A trajectory's turns share one reward: the gate must never score turns whose siblings were trained on.
    rule = HeldOutRule(percent=30)
    samples = [make_agent_sample(100 * t + n, t, n, 4) for t in range(60) for n in range(4)]
    held = {t: {rule.holds_out_sample(s) for s in samples[4 * t : 4 * t + 4]} for t in range(60)}
    assert all(len(verdicts) == 1 for verdicts in held.values())
    share = sum(True in verdicts for verdicts in held.values()) / 60
    assert 0.1 < share < 0.5, share  # the trajectory's digest spreads like sample ids do
    single = make_sample(7)
    assert rule.holds_out_sample(single) == rule.holds_out(single.sample_id)
