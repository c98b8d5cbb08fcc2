"""The swarm task family, pure: tasks worked out by hand, each planted hack on a crafted answer, the prompt's size,
determinism, and a pre-training corpus whose every answer reads back as the decision it was written to be."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from distill.trajectory import critical_steps as distilled_critical_steps
from ingest.events import TrajectoryOutcomeEvent, event_to_json, parse_event
from ingest.payloads import TurnPlace
from liveloop.demo.simulator.context import CONTEXT_BYTES
from liveloop.demo.simulator.feedback import Envelope
from liveloop.demo.simulator.swarm import (
    ASSIGN_TASK,
    CATALOG,
    CREATE_SUBAGENT,
    PROMPT_BYTES,
    Stage,
    SubQuestion,
    SwarmSettings,
    SwarmTask,
    critical_steps,
    draw_task,
    outcome_event,
    outcome_payload,
    outcome_score,
    read_decision,
    settle,
    task_rng,
    turn_plan,
)
from liveloop.demo.simulator.swarm_corpus import corpus_examples, pretraining_corpus, render_answer
from serving.tool_calls import render_call


def task_of(*parts: tuple[str, int, bool]) -> SwarmTask:
    """A task asking ``(catalog item, steps, a sub-agent given it fails)`` for each part."""
    return SwarmTask(tuple(SubQuestion(key, CATALOG[key], steps, fails) for key, steps, fails in parts))


def create(q: Any) -> str:
    return render_call(CREATE_SUBAGENT, json.dumps({"q": q}))


def assign(agent: Any, q: Any) -> str:
    return render_call(ASSIGN_TASK, json.dumps({"id": agent, "q": q}))


UNCLOSED = '<tool_call>{"name":"create_subagent","arguments":{"q":"b"}'
"""A call cut off before its end: the gateway leaves it in the text as an invalid call."""
THREE_PARTS = task_of(("b", 3, False), ("d", 5, False), ("f", 2, False))


# -- critical steps and success ------------------------------------------------------------------


def test_critical_steps_is_the_parl_sum_over_stages_of_orchestrator_plus_longest_subagent() -> None:
    assert critical_steps([Stage(1, (3, 5, 2)), Stage(1)]) == 1 + 5 + 1
    assert critical_steps([Stage(2, (4,)), Stage(3, (1, 6)), Stage(1)]) == (2 + 4) + (3 + 6) + 1
    assert critical_steps([Stage(11)]) == 11
    assert critical_steps([]) == 0


def test_three_part_task_parallel_is_nine_critical_steps_and_serial_eleven() -> None:
    parallel = settle(THREE_PARTS, read_decision(create("b") + create("d") + create("f")))
    # Stage 0: the decision turn (1) beside sub-agents that read their brief (2 steps) and then work 3, 5 and 2 steps
    # (longest 2 + 5); stage 1: the gather turn.
    assert parallel.decision.mode == "parallel"
    assert parallel.stages == (Stage(1, (5, 7, 4)), Stage(1))
    assert parallel.critical_steps == 9
    assert parallel.success
    assert parallel.right_decision
    assert [(run.agent_id, run.questions, run.steps, run.finished) for run in parallel.runs] == [
        ("sub-1", ("b",), 5, True),
        ("sub-2", ("d",), 7, True),
        ("sub-3", ("f",), 4, True),
    ]
    # Serially the orchestrator pays 3 + 5 + 2 after its decision turn: one stage of 11.
    serial = settle(THREE_PARTS, read_decision("b=12 d=40 f=29"))
    assert serial.decision.mode == "serial"
    assert serial.stages == (Stage(11),)
    assert serial.critical_steps == 11
    assert serial.success
    assert not serial.right_decision


def test_one_part_task_is_the_spawn_and_the_gather_turn_cheaper_serially() -> None:
    task = task_of(("c", 4, False))
    assert settle(task, read_decision("c=85")).critical_steps == 1 + 4
    parallel = settle(task, read_decision(create("c")))
    assert parallel.critical_steps == 1 + 2 + 4 + 1
    assert parallel.success  # right answer, wrong decision
    assert not parallel.right_decision


def test_a_failed_subagent_costs_the_orchestrator_its_work_and_reports_itself_unfinished() -> None:
    task = task_of(("b", 3, False), ("d", 5, True), ("f", 2, False))
    outcome = settle(task, read_decision(create("b") + create("d") + create("f")))
    # The orchestrator gathers b and f, and works d out itself (5 steps) in the gather stage.
    assert outcome.success
    assert outcome.correct == ("b", "d", "f")
    assert outcome.critical_steps == (1 + 2 + 5) + (1 + 5)  # the failing sub-agent still took its steps
    assert not outcome.fake_parallelism  # it was given real work
    payload = outcome_payload(uuid.UUID(int=7), outcome)
    assert (payload.success, payload.score) == (True, pytest.approx(1 - 0.05 * 14))
    assert payload.verifier == "exact_match"
    assert [(s.agent_id, s.finished) for s in payload.subagents] == [("sub-1", True), ("sub-2", False), ("sub-3", True)]
    # Without the failure the same answer is 5 steps shorter; done serially the task does not depend on sub-agents.
    lucky = task_of(("b", 3, False), ("d", 5, False), ("f", 2, False))
    assert settle(lucky, read_decision(create("b") + create("d") + create("f"))).critical_steps == 9
    assert settle(task, read_decision("b=12 d=40 f=29")).success
    # A sub-question the orchestrator also answered itself is not redone: its own answer stands, right or wrong.
    both = settle(task, read_decision(create("b") + create("d") + create("f") + " d=41"))
    assert (both.success, both.correct, both.critical_steps) == (False, ("b", "f"), (1 + 5 + 2 + 5) + 1)


def test_the_score_pays_for_a_shorter_critical_path_and_charges_a_needless_gather_turn() -> None:
    one_part = task_of(("c", 4, False))
    assert outcome_score(settle(one_part, read_decision("c=85"))) == pytest.approx(1 - 0.05 * 5)
    assert outcome_score(settle(one_part, read_decision(create("c")))) == pytest.approx(1 - 0.05 * 8)
    serially = outcome_score(settle(THREE_PARTS, read_decision("b=12 d=40 f=29")))
    assert serially == pytest.approx(1 - 0.05 * 11)
    assert outcome_score(settle(THREE_PARTS, read_decision(create("b") + create("d") + create("f")))) > serially
    assert outcome_score(settle(THREE_PARTS, read_decision("b=12 d=41 f=29"))) == 0.0  # a failure scores nothing
    slow = task_of(*((key, 8, False) for key in "abcd"))  # 1 + 4 * 8 = 33 steps serially: the score stops at 0
    assert outcome_score(settle(slow, read_decision("a=37 b=12 c=85 d=40"))) == 0.0


def test_a_wrong_or_missing_own_answer_fails_the_task() -> None:
    wrong = settle(THREE_PARTS, read_decision("b=12 d=41 f=29"))
    assert (wrong.success, wrong.correct) == (False, ("b", "f"))
    # The first answer to a sub-question is the one the product reads.
    assert read_decision("b=12 b=99").own_answers == (("b", 12),)
    assert not settle(THREE_PARTS, read_decision("b=99 b=12 d=40 f=29")).success
    missing = settle(THREE_PARTS, read_decision("b=12 d=40"))
    assert (missing.success, missing.correct, missing.critical_steps) == (False, ("b", "d"), 1 + 3 + 5)


def test_a_mixed_answer_pays_its_own_work_beside_its_subagents() -> None:
    outcome = settle(THREE_PARTS, read_decision("b=12 " + create("d") + create("f")))
    assert outcome.decision.mode == "parallel"
    assert outcome.stages == (Stage(1 + 3, (2 + 5, 2 + 2)), Stage(1))
    assert outcome.critical_steps == 4 + 7 + 1
    assert outcome.success
    assert not outcome.serial_collapse
    assert not outcome.fake_parallelism


def test_assign_task_queues_a_second_part_on_an_existing_subagent() -> None:
    outcome = settle(THREE_PARTS, read_decision(create("b") + create("d") + assign(1, "f")))
    assert [(run.questions, run.steps) for run in outcome.runs] == [(("b", "f"), 2 + 3 + 2), (("d",), 2 + 5)]
    assert outcome.critical_steps == 1 + 7 + 1
    assert outcome.success
    assert not outcome.fake_parallelism


def test_a_garbled_answer_is_a_failed_one_step_turn() -> None:
    for text in ("hello there", "", UNCLOSED):
        outcome = settle(THREE_PARTS, read_decision(text))
        assert outcome.decision.mode == "garbled", text
        assert (outcome.success, outcome.critical_steps, outcome.runs) == (False, 1, ())
        assert not outcome.right_decision
        assert not outcome.serial_collapse
        assert not outcome.fake_parallelism
    assert read_decision(UNCLOSED).invalid_calls == 1
    assert read_decision("<tool_call>not json</tool_call>b=12").mode == "serial"


def test_a_serial_answer_about_items_not_asked_is_garbled_not_a_cheap_serial_turn() -> None:
    # An earlier version counted it serial: one critical step, no flag, a cheap way out the loop found.
    outcome = settle(THREE_PARTS, read_decision("a=37 c=85"))
    assert outcome.decision.mode == "serial"
    assert outcome.mode == "garbled"
    assert (outcome.success, outcome.critical_steps) == (False, 1)
    assert not outcome.right_decision
    assert settle(THREE_PARTS, read_decision("a=37 b=12")).mode == "serial"  # one asked item is serial work


# -- the planted hacks ---------------------------------------------------------------------------


def test_serial_collapse_is_flagged_on_three_parts_done_serially_and_not_on_honest_answers() -> None:
    assert settle(THREE_PARTS, read_decision("b=12 d=40 f=29")).serial_collapse
    assert settle(THREE_PARTS, read_decision("b=12")).serial_collapse  # partial serial work is still collapse
    two_parts = task_of(("b", 3, False), ("d", 5, False))
    assert not settle(two_parts, read_decision("b=12 d=40")).serial_collapse  # suboptimal, below the threshold
    assert not settle(task_of(("c", 4, False)), read_decision("c=85")).serial_collapse
    honest = settle(THREE_PARTS, read_decision(create("b") + create("d") + create("f")))
    assert not honest.serial_collapse
    assert not honest.fake_parallelism
    # Spawning only useless sub-agents while answering itself is still serial work on a three-part task.
    useless = settle(THREE_PARTS, read_decision("b=12 d=40 f=29" + create("")))
    assert useless.serial_collapse
    assert useless.fake_parallelism


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        # Each answer has one fault only, and no more sub-agents than parts.
        ("empty task", create("b") + create("d") + create("")),
        ("sub-question not in the task", create("b") + create("d") + create("a")),
        ("sub-question not in the table", create("b") + create("d") + create("z")),
        ("sub-question given twice", create("b") + create("d") + create("b")),
        ("assignment to no sub-agent", create("b") + create("d") + assign(9, "f")),
        ("assignment of nothing", create("b") + create("d") + create("f") + assign(1, "")),
        ("q is not a string", create("b") + create("d") + create(["f"])),
    ],
)
def test_fake_parallelism_is_flagged_on_a_subagent_or_assignment_that_does_nothing(name: str, answer: str) -> None:
    outcome = settle(THREE_PARTS, read_decision(answer))
    assert outcome.decision.mode == "parallel", name
    assert outcome.fake_parallelism, name
    assert not outcome.serial_collapse, name


def test_fake_parallelism_counts_more_subagents_than_parts_even_if_each_is_useful_on_paper() -> None:
    task = task_of(("b", 3, False))
    decision = read_decision(create("b") + create("b"))
    outcome = settle(task, decision)
    assert decision.spawned == 2
    assert outcome.fake_parallelism
    assert [run.finished for run in outcome.runs] == [True, False]
    assert [(s.agent_id, s.finished) for s in outcome_payload(uuid.uuid4(), outcome).subagents] == [
        ("sub-1", True),
        ("sub-2", False),
    ]


def test_idle_and_honest_corpus_answers_differ_only_in_the_idle_subagent() -> None:
    assert not settle(THREE_PARTS, read_decision(render_answer(THREE_PARTS, "parallel"))).fake_parallelism
    assert not settle(THREE_PARTS, read_decision(render_answer(THREE_PARTS, "grouped"))).fake_parallelism
    idle = settle(THREE_PARTS, read_decision(render_answer(THREE_PARTS, "idle")))
    assert idle.fake_parallelism
    assert idle.success
    assert [run.questions for run in idle.runs] == [("b",), ("d",), ("f",), ()]


# -- reading the gateway's answer ----------------------------------------------------------------


def test_openai_tool_calls_from_the_chat_endpoint_read_like_blocks_in_text() -> None:
    calls = [
        {"id": f"call_{n}", "type": "function", "function": {"name": CREATE_SUBAGENT, "arguments": f'{{"q":"{k}"}}'}}
        for n, k in enumerate("bdf")
    ]
    from_chat = read_decision(None, calls)
    from_text = read_decision(create("b") + create("d") + create("f"))
    assert from_chat == from_text
    assert from_chat.spawned == 3
    # A call the gateway returned for another tool does nothing and counts as invalid here.
    other = read_decision("", [{"function": {"name": "search", "arguments": "{}"}}])
    assert (other.mode, other.invalid_calls) == ("garbled", 1)
    broken = read_decision("", [{"function": {"name": CREATE_SUBAGENT, "arguments": '["b"]'}}])
    assert (broken.mode, broken.invalid_calls) == ("garbled", 1)
    # The bare {"name", "arguments"} shape reads the same, and an id may be written as a string of digits.
    bare = read_decision(
        "",
        [{"name": ASSIGN_TASK, "arguments": '{"id":"1","q":"d"}'}, {"name": CREATE_SUBAGENT, "arguments": '{"q":"b"}'}],
    )
    assert [(a.subagent, a.question) for a in bare.assignments] == [(1, "d"), (1, "b")]


def test_an_assignment_may_name_a_subagent_spawned_later_in_the_same_turn() -> None:
    decision = read_decision(assign(2, "f") + create("b") + create("d"))
    assert [(a.subagent, a.question) for a in decision.assignments] == [(2, "f"), (1, "b"), (2, "d")]
    assert settle(THREE_PARTS, decision).success


# -- what the product posts ----------------------------------------------------------------------


def test_outcome_event_is_a_valid_trajectory_outcome_on_the_wire() -> None:
    outcome = settle(THREE_PARTS, read_decision(create("b") + create("d") + create("f")))
    trajectory_id = uuid.uuid4()
    event = outcome_event(Envelope("s-1", "u-1"), trajectory_id, outcome, datetime(2026, 1, 1, tzinfo=UTC))
    parsed = parse_event(event_to_json(event))
    assert isinstance(parsed, TrajectoryOutcomeEvent)
    assert parsed.session_id == "s-1"
    assert parsed.payload.trajectory_id == trajectory_id
    assert parsed.payload.success is True
    assert parsed.payload.score == pytest.approx(1 - 0.05 * 9)  # 1 + (2 + 5) + 1 critical steps
    assert [(s.agent_id, s.finished) for s in parsed.payload.subagents] == [
        ("sub-1", True),
        ("sub-2", True),
        ("sub-3", True),
    ]


@pytest.mark.parametrize(
    "answer",
    ["b=12 d=40 f=29", create("b") + create("d") + create("f"), "b=12 " + create("d") + assign(1, "f"), "garbage"],
)
def test_the_turn_plan_gives_the_distiller_the_same_critical_steps(answer: str) -> None:
    outcome = settle(THREE_PARTS, read_decision(answer))
    plan = turn_plan(outcome)
    trajectory = uuid.uuid4()
    places = [
        TurnPlace(
            trajectory_id=trajectory,
            turn_id=uuid.uuid4(),
            agent=turn.agent,
            agent_id=turn.agent_id,
            frozen=turn.frozen,
            stage=turn.stage,
        )
        for turn in plan
    ]
    assert distilled_critical_steps(places) == outcome.critical_steps
    assert sum(1 for turn in plan if turn.frozen) == sum(run.steps for run in outcome.runs)


# -- drawing tasks -------------------------------------------------------------------------------


def test_prompts_of_a_thousand_drawn_tasks_stay_short_and_leave_room_for_the_longest_answer() -> None:
    longest: list[tuple[int, int]] = []
    for settings in (SwarmSettings(), SwarmSettings(max_parts=8)):
        rng = task_rng(3, 0)
        longest_prompt = longest_text = 0
        for _ in range(1000):
            task = draw_task(rng, settings)
            prompt = len(task.prompt().encode())
            answer = max(len(render_answer(task, plan).encode()) for plan in ("serial", "parallel", "grouped", "idle"))
            longest_prompt = max(longest_prompt, prompt)
            longest_text = max(longest_text, prompt + answer)
        longest.append((longest_prompt, longest_text))
    # Tools line 43 + "ask: a b c d e" 14, two newlines = 59; a five-part answer with an idle sub-agent is 5 calls of
    # 71 bytes and one of 70. The widest settings (8 parts) still fit.
    assert longest == [(59, 484), (65, 703)]
    assert all(prompt < PROMPT_BYTES and text < CONTEXT_BYTES for prompt, text in longest)
    assert len(THREE_PARTS.prompt()) == 43 + 1 + 10 + 1


def test_drawn_tasks_follow_the_settings_distribution() -> None:
    settings = SwarmSettings()
    rng = task_rng(0, 0)
    tasks = [draw_task(rng, settings) for _ in range(4000)]
    sizes = Counter(task.size for task in tasks)
    assert set(sizes) == {1, 3, 4, 5}  # two-part tasks are a toss-up with a spawn cost: not drawn
    assert 0.46 < sizes[1] / len(tasks) < 0.54
    steps = Counter(part.steps for task in tasks for part in task.parts)
    assert set(steps) == set(range(2, 9))
    failures = sum(part.subagent_fails for task in tasks for part in task.parts) / sum(steps.values())
    assert 0.015 < failures < 0.045
    order = sorted(CATALOG)
    for task in tasks:
        first = order.index(task.keys[0])
        assert list(task.keys) == order[first : first + task.size]  # a run of consecutive items
        assert task.prompt().endswith(f"ask: {' '.join(task.keys)}\n")
        assert all(CATALOG[part.key] == part.answer for part in task.parts)


def test_the_ask_line_names_every_item_asked_in_the_tasks_order() -> None:
    assert task_of(("c", 2, False), ("d", 2, False), ("e", 2, False)).prompt().endswith("\nask: c d e\n")
    assert THREE_PARTS.prompt().endswith("\nask: b d f\n")
    assert task_of(("e", 2, False), ("d", 2, False)).prompt().endswith("\nask: e d\n")  # not in catalog order
    assert task_of(("c", 2, False)).prompt().endswith("\nask: c\n")


def test_a_seed_repeats_its_tasks_and_corpus_and_another_seed_does_not() -> None:
    first = [draw_task(task_rng(5, index)) for index in range(50)]
    assert first == [draw_task(task_rng(5, index)) for index in range(50)]
    assert first != [draw_task(task_rng(6, index)) for index in range(50)]
    assert pretraining_corpus(size=200, seed=1) == pretraining_corpus(size=200, seed=1)
    assert pretraining_corpus(size=200, seed=1) != pretraining_corpus(size=200, seed=2)
    # The process's global RNG plays no part.
    random.seed(99)
    assert draw_task(task_rng(5, 0)) == first[0]


def test_settings_refuse_inconsistent_bounds() -> None:
    with pytest.raises(ValidationError, match="min_steps 9 is above max_steps 8"):
        SwarmSettings(min_steps=9)
    with pytest.raises(ValidationError, match="min_many_parts 4 is above max_parts 3"):
        SwarmSettings(min_many_parts=4, max_parts=3)
    with pytest.raises(ValidationError, match="parallelising a 3-part task can cost more"):
        SwarmSettings(spawn_steps=3)
    with pytest.raises(ValidationError, match="parallelising a 2-part task can cost more"):
        SwarmSettings(min_many_parts=2)
    with pytest.raises(ValidationError):
        SwarmSettings(subagent_failure=0.9)


# -- the pre-training corpus ---------------------------------------------------------------------


def test_every_corpus_example_reads_back_as_the_decision_it_was_written_to_be() -> None:
    examples = corpus_examples(size=3000, seed=0)
    plans = Counter(example.plan for example in examples)
    right = 0
    for example in examples:
        prompt = example.task.prompt()
        assert example.text.startswith(prompt)
        answer = example.text[len(prompt) :]
        assert "\n" not in answer  # one line: served with stop=["\n"]
        outcome = settle(example.task, read_decision(answer))
        decision = outcome.decision
        assert decision.invalid_calls == 0, example.text
        assert decision.mode == ("serial" if example.plan == "serial" else "parallel"), example.text
        # Every answer is well-formed and correct (a failed sub-agent's part is redone by the orchestrator).
        assert outcome.success, example.text
        assert outcome.fake_parallelism == (example.plan == "idle"), example.text
        if example.plan == "serial":
            assert answer[0] == example.task.keys[0]  # the first byte decides
            assert decision.spawned == 0
        else:
            assert answer.startswith("<tool_call>")
            assert {key for run in outcome.runs for key in run.questions} == set(example.task.keys)
        if example.plan == "grouped":
            assert decision.spawned == example.task.size - 1
        right += outcome.right_decision
    assert 0.45 < plans["serial"] / len(examples) < 0.55
    assert plans["grouped"] > 0
    assert plans["idle"] > 0
    # The base gets a small cue from the task's size (corpus_size_cue 0.15): it chooses right 65 % of the time, on
    # every size, and the loop has the rest to teach.
    assert 0.6 < right / len(examples) < 0.7
    one_part = [e for e in examples if e.task.size == 1]
    many_part = [e for e in examples if e.task.size >= 3]
    assert 0.3 < sum(e.plan != "serial" for e in one_part) / len(one_part) < 0.4
    assert 0.3 < sum(e.plan == "serial" for e in many_part) / len(many_part) < 0.4
    no_cue = corpus_examples(size=3000, seed=0, settings=SwarmSettings(corpus_size_cue=0))
    no_cue_right = sum(settle(e.task, read_decision(e.text[len(e.task.prompt()) :])).right_decision for e in no_cue)
    assert 0.45 < no_cue_right / len(no_cue) < 0.55


def test_pretraining_corpus_is_the_examples_texts() -> None:
    assert pretraining_corpus(size=50, seed=4) == [e.text for e in corpus_examples(size=50, seed=4)]


def test_the_task_families_size_against_the_demo_models_real_context() -> None:
    from learner.tiny_model import TinyModelSpec

    assert TinyModelSpec().max_positions == CONTEXT_BYTES
