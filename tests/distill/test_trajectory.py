"""Agent trajectories, pure: fixed trees worked out by hand, and one test per guard where the hack happens.

Default agent spec (distill/specs/default.yaml): performance 1.0, invalid_tool_call -0.5 each, deferral -0.1
each, give_up -0.5, budget_overrun -0.25 each, serial_collapse -0.5, fake_parallelism -0.5 x share,
timed_out -0.5; parallel_cap 4, min_searches 3, serial_steps 6, timeout_s 1800; clip [-2, 2].
"""

from __future__ import annotations

import json
import math

import pytest

from distill.metrics import AGENT_GUARD_COUNTERS, REGISTRY, TRAJECTORIES_COUNTER, count_trajectories
from distill.samples import Sample, parse_sample, sample_id_for, sample_to_json
from distill.spec import RewardSpec, load_spec
from distill.trajectory import GUARDS, InvalidTrajectory, TrajectoryCredit, trajectory_samples
from ingest.events import GenerationEvent, TrajectoryOutcomeEvent
from tests.distill.agent_trajectories import Tree, orchestrator_tree, pruned_search_tree, summary_tree

SPEC = load_spec()
NO_GUARD = dict.fromkeys(GUARDS, 0.0)


def run(tree: Tree, spec: RewardSpec = SPEC) -> tuple[TrajectoryCredit, list[Sample]]:
    events = tree.parsed()
    turns = [e for e in events if isinstance(e, GenerationEvent)]
    outcomes = [e for e in events if isinstance(e, TrajectoryOutcomeEvent)]
    return trajectory_samples(turns, events, outcomes[0] if outcomes else None, spec)


def test_three_stage_orchestrator_with_two_and_three_parallel_subagents_one_unfinished() -> None:
    tree, orchestrator = orchestrator_tree()
    credit, samples = run(tree)
    # Stage 0: 1 orchestrator turn + longest of sub-1 (2), sub-2 (3) = 4; stage 1: 1 + longest of 1, 2, 4 = 5;
    # stage 2: 2 orchestrator turns, no sub-agent = 2. Total 11 (16 turns in all).
    assert credit.critical_steps == 4 + 5 + 2
    assert credit.turns == 16
    assert credit.finalised_by == "outcome"
    assert (credit.spawned, credit.finished) == (5, 4)
    assert credit.r_perf == 0.8
    assert credit.r_parallel == 1.0  # min(5, 4) / 4
    assert credit.r_finish == 4 / 5
    assert credit.guards == {**NO_GUARD, "fake_parallelism": 1 / 5}
    assert credit.components == {"fake_parallelism": -0.5 * (1 / 5), "performance": 1.0 * 0.8}
    assert credit.reward == math.fsum([0.8, -0.1])
    # Frozen sub-agents are the environment: only the four orchestrator turns are samples.
    assert [str(s.generation_id) for s in samples] == orchestrator
    assert [s.loss_mask for s in samples] == [[1, 1], [1, 1, 0, 0, 1], [1, 1], [1, 1]]
    for sample in samples:
        assert sample.agent is not None
        assert sample.sample_id == sample_id_for(sample.generation_id, SPEC.spec_hash)
        assert sample.finalised_by == "outcome"
        assert sample.reward == credit.reward
        assert sample.components == credit.components
        assert "r_parallel" not in sample.components  # shaping is the learner's, annealed
        assert (sample.agent.agent, sample.agent.frozen, sample.agent.summary_turn) == ("orchestrator", False, False)
        assert (sample.agent.trajectory_turns, sample.agent.critical_steps) == (4, 11)
        assert (sample.agent.r_perf, sample.agent.r_parallel, sample.agent.r_finish) == (0.8, 1.0, 0.8)
        assert sample.agent.guards == credit.guards
        assert parse_sample(sample_to_json(sample)) == sample
    assert [s.agent.stage for s in samples if s.agent] == [0, 1, 2, 2]


def test_two_summary_boundaries_credit_the_summary_turns_and_mask_the_summaries() -> None:
    tree, turns = summary_tree()
    credit, samples = run(tree)
    assert credit.critical_steps == 5  # a single agent: its turn count
    assert (credit.r_perf, credit.r_parallel, credit.r_finish) == (1.0, 0.0, 0.0)
    assert credit.guards == NO_GUARD
    assert credit.components == {"performance": 1.0}
    assert credit.reward == 1.0
    assert [str(s.generation_id) for s in samples] == turns
    # Turns 2 and 4 wrote the summaries (trainable, credited); turns 3 and 5 mask the summary they start from.
    assert [s.agent.summary_turn for s in samples if s.agent] == [False, True, False, True, False]
    assert [s.agent.boundary for s in samples if s.agent] == ["none", "none", "summary", "none", "summary"]
    assert [s.loss_mask for s in samples] == [[1, 1], [1, 1, 1], [0, 0, 1], [1, 1], [0, 1, 1]]
    assert {s.reward for s in samples} == {1.0}


def with_turn_check(weight: float, spec: RewardSpec = SPEC) -> RewardSpec:
    assert spec.agent is not None
    weights = spec.agent.weights.model_copy(update={"turn_check": weight})
    return spec.model_copy(update={"agent": spec.agent.model_copy(update={"weights": weights})})


def test_a_summary_turns_own_check_adds_to_its_reward_alone() -> None:
    tree, turns = summary_tree()
    tree.tests_result(turns[1], passed=3, failed=1)  # the first summary kept 3 of its checks
    tree.tests_result(turns[3], passed=0, failed=2)  # the second lost both
    tree.tests_result(turns[3], passed=1, failed=1)  # a later check of the same turn replaces it
    tree.tests_result(turns[4], passed=0, failed=0)  # checked nothing: no part of its reward
    spec = with_turn_check(0.5)
    credit, samples = run(tree, spec)
    assert credit.reward == 1.0  # the trajectory's own figures do not change
    assert [s.reward for s in samples] == [1.0, 1.0 + 0.5 * 3 / 4, 1.0, 1.0 + 0.5 * 1 / 2, 1.0]
    assert samples[1].components == {"performance": 1.0, "turn_check": 0.375}
    assert samples[0].components == credit.components
    assert {s.agent.trajectory_id for s in samples if s.agent} == {credit.trajectory_id}


def test_a_turn_check_counts_nothing_at_weight_0_and_is_clipped() -> None:
    tree, turns = summary_tree()
    tree.tests_result(turns[1], passed=1, failed=0)
    assert {s.reward for s in run(tree)[1]} == {1.0}  # the default spec's weight is 0
    assert "turn_check" not in SPEC.canonical_json().decode()  # and leaves agent specs' hashes as they were
    spec = with_turn_check(2.0).model_copy(update={"clip": (-3.0, 2.8)})
    rewards = [s.reward for s in run(tree, spec)[1]]
    assert rewards[1] == 2.8  # 1.0 + 2.0, clipped
    assert min(rewards) == 1.0
    # A perfect checked turn (3.0) with one invalid call (-0.5) must stay below the upper bound.
    with pytest.raises(ValueError, match="clipping would hide the penalty"):
        RewardSpec.model_validate({**spec.model_dump(), "clip": (-3.0, 2.5)})


def with_weights(spec: RewardSpec = SPEC, **weights: float) -> RewardSpec:
    assert spec.agent is not None
    changed = spec.agent.weights.model_copy(update=weights)
    return spec.model_copy(update={"agent": spec.agent.model_copy(update={"weights": changed})})


def test_a_checks_spans_credit_their_own_characters_and_leave_the_reward_alone() -> None:
    tree, turns = summary_tree()  # turn 2 wrote "summary of the work so far" (26 characters)
    tree.tests_result(turns[1], passed=1, failed=1, spans=[(11, 15, False), (0, 7, True), (20, 40, False)])
    credit, samples = run(tree, with_weights(span_check=0.5))
    summary = samples[1].agent
    assert summary is not None
    # By start; a span past the completion names no token of this turn and is left out.
    assert [(s.start, s.end, s.credit) for s in summary.spans] == [(0, 7, 0.5), (11, 15, -0.5)]
    assert [s.reward for s in samples] == [credit.reward] * 5  # token credit only: the gate judges the same reward
    assert all(not s.agent.spans for s in samples if s.agent and s.agent is not summary)
    assert parse_sample(sample_to_json(samples[1])) == samples[1]
    # The default spec's weight is 0: no spans, and agent specs keep their hashes.
    assert all(not s.agent.spans for s in run(tree)[1] if s.agent)
    assert "span_check" not in SPEC.canonical_json().decode()
    assert "span_check" in with_weights(span_check=0.5).canonical_json().decode()


def test_a_sample_refuses_a_credited_span_past_its_completion() -> None:
    tree, turns = summary_tree()
    tree.tests_result(turns[1], passed=1, failed=0, spans=[(0, 7, True)])
    sample = run(tree, with_weights(span_check=0.5))[1][1]
    data = sample.model_dump(mode="json")
    data["agent"]["spans"] = [{"start": 20, "end": 27, "credit": 0.5}]
    with pytest.raises(ValueError, match="runs past the completion's 26 characters"):
        Sample.model_validate_json(json.dumps(data))


def test_pruned_search_over_budget() -> None:
    tree, turns = pruned_search_tree()
    credit, samples = run(tree)
    assert credit.critical_steps == 5
    # Two searches count; the third was refused (turn 3 was served at 1200 of 1000 tokens), so it is no search,
    # and not an invalid call either: it is an overrun, like the turn itself. prune_chunks passed.
    assert (credit.searches, credit.prunes) == (2, 1)
    assert credit.guards == {**NO_GUARD, "budget_overrun": 2.0}
    assert (credit.r_perf, credit.r_parallel, credit.r_finish) == (0.25, 0.0, 0.0)
    assert credit.components == {"budget_overrun": -0.25 * 2, "performance": 0.25}
    assert credit.reward == -0.25
    assert [str(s.generation_id) for s in samples] == turns
    assert [s.loss_mask for s in samples] == [[1, 1], [1, 0, 0, 1], [1, 1], [1, 1], [1, 1]]
    assert [s.invalid_tool_calls for s in samples] == [0, 0, 0, 0, 0]
    assert [s.agent.boundary for s in samples if s.agent] == ["none", "none", "none", "prune", "none"]


def test_the_same_events_in_any_order_give_the_same_bytes() -> None:
    tree, _ = orchestrator_tree()
    events = tree.parsed()
    turns = [e for e in events if isinstance(e, GenerationEvent)]
    outcome = next(e for e in events if isinstance(e, TrajectoryOutcomeEvent))
    _, forward = trajectory_samples(turns, events, outcome, SPEC)
    _, backward = trajectory_samples(turns[::-1] + turns[:3], events[::-1], outcome, SPEC)  # and repeats
    assert [sample_to_json(s) for s in forward] == [sample_to_json(s) for s in backward]


def test_turns_of_two_trajectories_are_refused() -> None:
    first, second = Tree(seed=1), Tree(seed=2)
    first.turn()
    second.turn()
    turns = [e for e in first.parsed() + second.parsed() if isinstance(e, GenerationEvent)]
    with pytest.raises(InvalidTrajectory, match="several trajectories"):
        trajectory_samples(turns, [], None, SPEC)


def test_a_spec_without_an_agent_section_cannot_credit_trajectories_and_keeps_its_hash() -> None:
    old = SPEC.model_copy(update={"agent": None})
    assert b'"agent"' not in old.canonical_json()
    tree, _ = summary_tree()
    with pytest.raises(InvalidTrajectory, match="no agent section"):
        run(tree, old)


# -- guards: each hack, and the metric and the reward that show it ------------------------------------------


def counted(credit: TrajectoryCredit) -> dict[str, float]:
    """Count the credit on the Prometheus counters; return each guard counter's increase."""
    before = {guard: REGISTRY.get_sample_value(name) or 0.0 for guard, name in AGENT_GUARD_COUNTERS.items()}
    count_trajectories([credit])
    after = {guard: REGISTRY.get_sample_value(name) or 0.0 for guard, name in AGENT_GUARD_COUNTERS.items()}
    return {guard: after[guard] - before[guard] for guard in AGENT_GUARD_COUNTERS}


def fired(credit: TrajectoryCredit) -> set[str]:
    return {guard for guard, metric in credit.guards.items() if metric}


def assert_only(credit: TrajectoryCredit, guard: str, metric: float, reward: float) -> None:
    assert fired(credit) == {guard}
    assert credit.guards[guard] == metric
    assert credit.reward == reward
    increase = counted(credit)
    assert increase == {**dict.fromkeys(GUARDS, 0.0), guard: 1.0}


def test_serial_collapse_an_orchestrator_that_never_spawns() -> None:
    honest, collapsed = Tree(seed=3), Tree(seed=4)
    for _ in range(5):
        honest.turn("orchestrator", calls=["read"])
    honest.outcome(True)
    for _ in range(6):
        collapsed.turn("orchestrator", calls=["read"])
    collapsed.outcome(True)
    assert fired(run(honest)[0]) == set()  # five serial steps are below serial_steps
    credit, samples = run(collapsed)
    assert credit.r_parallel == 0.0
    assert_only(credit, "serial_collapse", 1.0, 1.0 - 0.5)
    assert {s.reward for s in samples} == {0.5}


def test_fake_parallelism_subagents_spawned_with_nothing_to_do() -> None:
    tree = Tree(seed=5)
    o1 = tree.turn("orchestrator", calls=["create_subagent"] * 4)  # four spawned, one ever runs
    tree.turn("subagent", agent_id="sub-1", frozen=True, parent=o1)
    tree.turn("orchestrator", parent=o1, completion="Done.")
    tree.outcome(True, subagents={"sub-1": True})
    credit, _ = run(tree)
    assert (credit.spawned, credit.finished, credit.r_finish, credit.r_parallel) == (4, 1, 0.25, 1.0)
    assert_only(credit, "fake_parallelism", 3 / 4, math.fsum([1.0, -0.5 * 0.75]))


def test_invalid_tool_calls_are_penalised_even_on_a_successful_trajectory() -> None:
    tree = Tree(seed=6)
    t1 = tree.turn(calls=["search", "read"], invalid=(0,))  # malformed call, flagged by the gateway
    tree.tool_result(t1, "read", valid=False, call_index=1)  # failed when run
    tree.turn(parent=t1, calls=["search", "search"], completion="Found it.")
    tree.outcome(True)
    credit, samples = run(tree)
    assert [s.invalid_tool_calls for s in samples] == [2, 0]
    assert_only(credit, "invalid_tool_call", 2.0, 1.0 - 0.5 * 2)


def test_deferral_by_clarifying_question() -> None:
    tree = Tree(seed=7)
    tree.turn(calls=["search", "search", "search"])
    tree.turn(completion="Which of the three files do you want me to change?")
    tree.outcome(False)
    credit, samples = run(tree)
    assert [s.deferral for s in samples] == [False, True]
    assert_only(credit, "deferral", 1.0, 0.0 - 0.1)


def test_search_then_give_up() -> None:
    quitter, persistent = Tree(seed=8), Tree(seed=9)
    quitter.turn(calls=["search"])
    quitter.turn(completion="I could not find it.")
    quitter.outcome(False, gave_up=True)
    for _ in range(3):
        persistent.turn(calls=["search"])
    persistent.outcome(False, gave_up=True)
    assert fired(run(persistent)[0]) == set()  # three searches, then giving up honestly
    assert_only(run(quitter)[0], "give_up", 1.0, 0.0 - 0.5)


def test_budget_overrun_turn_and_refused_call() -> None:
    tree = Tree(seed=10)
    tree.turn(calls=["read"], context_tokens=900, budget_tokens=1000)
    tree.turn(calls=["read"], invalid=(0,), context_tokens=1001, budget_tokens=1000)  # refused: not an invalid call
    tree.outcome(True)
    credit, samples = run(tree)
    assert [s.invalid_tool_calls for s in samples] == [0, 0]
    assert_only(credit, "budget_overrun", 2.0, 1.0 - 0.25 * 2)


def test_a_trajectory_that_never_finishes_times_out_with_no_better_reward() -> None:
    tree = Tree(seed=11)
    tree.turn(calls=["read"], invalid=(0,))
    credit, samples = run(tree)
    assert credit.finalised_by == "timeout"
    assert credit.r_perf == 0.0
    assert credit.guards == {**NO_GUARD, "invalid_tool_call": 1.0, "timed_out": 1.0}
    assert credit.reward == math.fsum([0.0, -0.5, -0.5])  # worse than failing with the same invalid call
    assert [s.finalised_by for s in samples] == ["timeout"]
    before = REGISTRY.get_sample_value(TRAJECTORIES_COUNTER, {"finalised_by": "timeout"}) or 0.0
    assert counted(credit)["timed_out"] == 1.0
    assert REGISTRY.get_sample_value(TRAJECTORIES_COUNTER, {"finalised_by": "timeout"}) == before + 1
