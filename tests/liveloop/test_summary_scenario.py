"""The summary task family, pure: sessions worked out by hand, the verbatim-copy hack on a crafted summary and not on
honest ones, prompt and context sizes, determinism, and a pre-training corpus whose every summary reads back as the
plan it was written in."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from distill.spec import load_spec
from distill.trajectory import trajectory_samples
from ingest.events import GenerationEvent, TrajectoryOutcomeEvent, event_to_json, parse_event
from liveloop.demo.simulator.context import CONTEXT_BYTES
from liveloop.demo.simulator.feedback import Envelope
from liveloop.demo.simulator.summaries import (
    CATALOG,
    DEFAULT_SETTINGS,
    LONGEST_TURN_BYTES,
    PROMPT_BYTES,
    SUMMARY_CUE,
    SummarySettings,
    SummaryTask,
    ask,
    chat,
    cut_summary,
    draw_task,
    facts_held,
    is_verbatim_copy,
    note,
    outcome_event,
    outcome_payload,
    play,
    play_with,
    read_fact,
    read_summary,
    success_by_crossings,
    summarise_prompt,
    task_rng,
    turn_plan,
)
from liveloop.demo.simulator.summary_corpus import Plan, corpus_examples, pretraining_corpus, render_summary
from tests.distill.agent_trajectories import Tree

SMALL = SummarySettings(min_facts=1, max_facts=2, trigger_bytes=96, summary_limit_bytes=16, verbatim_min_bytes=12)
"""Settings small enough to work a session out by hand: a summary is asked for past 96 bytes and cut at 16."""
TWO_FACTS = SummaryTask(
    facts=(("A", 1111), ("B", 2222)),
    turns=(
        note("A", 1111),  # 13 bytes with its newline
        chat("build", "tests", "slow", "lunch"),  # 29: 42
        note("B", 2222),  # 13: 55
        chat("deploy", "review", "merge", "docs"),  # 31: 86
        chat("lint", "retry"),  # 17: 103 > 96, the first boundary
        ask("B"),
        chat("cache", "flaky", "queue", "logs"),
        chat("deploy", "review", "merge", "docs"),
        chat("lint", "retry"),  # past 96 again: the second boundary
        ask("A"),
    ),
)
FIRST_CONTEXT = (
    "note: A=1111\nchat: build tests slow lunch\nnote: B=2222\nchat: deploy review merge docs\nchat: lint retry\n"
)


def writer(task: SummaryTask, plan: Plan, settings: SummarySettings = DEFAULT_SETTINGS) -> Callable[[str], str]:
    """A summariser writing every summary of ``task`` in ``plan`` (as the corpus does)."""
    return lambda prompt: render_summary(prompt, task, plan, settings=settings)


def keeping(*keys: str) -> str:
    """A summary completion keeping these facts of :data:`TWO_FACTS`."""
    return "".join(f" {key}={TWO_FACTS.value(key)}" for key in keys)


# -- a session worked out by hand ----------------------------------------------------------------


def test_an_honest_session_asks_for_two_summaries_and_answers_every_question() -> None:
    first = play(TWO_FACTS, [], SMALL)
    assert first.outcome is None
    assert first.next_prompt == FIRST_CONTEXT + SUMMARY_CUE
    assert len(FIRST_CONTEXT.encode()) == 103
    # The session goes on from "summary: A=1111 B=2222" (23 bytes), "ask: b" (30), 29 (59), 31 (90), 17 (107 > 96).
    second = play(TWO_FACTS, [keeping("A", "B")], SMALL)
    assert second.next_prompt == (
        "summary: A=1111 B=2222\nask: b\nchat: cache flaky queue logs\nchat: deploy review merge docs\n"
        "chat: lint retry\nsummary:"
    )
    outcome = play(TWO_FACTS, [keeping("A", "B"), keeping("A", "B")], SMALL).outcome
    assert outcome is not None
    assert outcome.boundaries == 2
    assert [(a.key, a.answered, a.crossed, a.correct) for a in outcome.answers] == [
        ("B", 2222, 1, True),
        ("A", 1111, 2, True),
    ]
    assert (outcome.success, outcome.score, outcome.verbatim_copy) == (True, 1.0, False)
    assert [(s.held, s.kept, s.lost, s.cut, s.bytes) for s in outcome.summaries] == [
        (("A", "B"), ("A", "B"), (), False, 14),
        (("A", "B"), ("A", "B"), (), False, 14),
    ]
    assert success_by_crossings([outcome]) == {1: (1, 1), 2: (1, 1)}
    with pytest.raises(ValueError, match="3 summaries given for a session with 2 boundaries"):
        play(TWO_FACTS, [keeping("A", "B")] * 3, SMALL)


def test_a_summary_that_drops_a_fact_fails_the_question_that_needs_it_only() -> None:
    outcome = play_with(TWO_FACTS, lambda prompt: keeping(*facts_held(prompt, TWO_FACTS)[:1]), SMALL)
    # The first summary keeps a and loses b: "ask: b" after it fails; a survives both boundaries.
    assert [(s.held, s.kept, s.lost) for s in outcome.summaries] == [(("A", "B"), ("A",), ("B",)), (("A",), ("A",), ())]
    assert [(a.key, a.answered, a.crossed) for a in outcome.answers] == [("B", None, 1), ("A", 1111, 2)]
    assert (outcome.success, outcome.score, outcome.verbatim_copy) == (False, 0.5, False)
    assert success_by_crossings([outcome]) == {1: (0, 1), 2: (1, 1)}
    payload = outcome_payload(uuid.UUID(int=3), outcome)
    assert (payload.success, payload.score, payload.performance, payload.verifier) == (False, 0.5, 0.5, "exact_match")


def test_a_question_before_any_boundary_is_answered_from_the_notes() -> None:
    task = SummaryTask((("K", 4821),), (note("K", 4821), chat("lunch", "today"), ask("K")))
    outcome = play(task, [], SMALL).outcome
    assert outcome is not None
    assert outcome.boundaries == 0
    assert [(a.answered, a.crossed, a.correct) for a in outcome.answers] == [(4821, 0, True)]


def test_the_reader_takes_the_last_value_and_a_wrong_value_is_no_answer() -> None:
    assert read_fact("note: Q=4821\nsummary: Q=4822\n", "Q") == 4822
    assert read_fact("note: Q=48\n", "Q") is None  # cut short: not a fact
    assert read_fact("note: Q=48210\n", "Q") is None  # five digits: not a fact
    assert read_fact("note: xQ=4821\n", "Q") is None  # the key is one letter, standing alone
    wrong = read_summary(" A=1111 B=2223", FIRST_CONTEXT + SUMMARY_CUE, TWO_FACTS, SMALL)
    assert (wrong.kept, wrong.lost, wrong.wrong) == (("A",), ("B",), ("B",))
    # The product drops the wrong value (its context did not hold it): the question finds nothing.
    outcome = play(TWO_FACTS, [" A=1111 B=2223", keeping("A")], SMALL).outcome
    assert outcome is not None
    assert outcome.summaries[0].grounded_line == "summary: A=1111"
    assert [(a.key, a.answered, a.correct) for a in outcome.answers] == [("B", None, False), ("A", 1111, True)]
    # Kept as written (the pre-training corpus), the reader finds the wrong value.
    written = play(TWO_FACTS, [" A=1111 B=2223", keeping("A")], SMALL, as_written=True).outcome
    assert written is not None
    assert [(a.key, a.answered, a.correct) for a in written.answers] == [("B", 2223, False), ("A", 1111, True)]


def test_a_summary_that_writes_a_fact_it_was_not_given_is_flagged_and_answers_nothing() -> None:
    task = SummaryTask(
        facts=(("A", 1111),),
        turns=(
            note("A", 1111),  # 13 bytes with its newline
            ask("B"),  # 7: 20; a decoy before any boundary: nothing to read, answered right
            chat("build", "tests", "slow", "lunch"),  # 29: 49
            chat("deploy", "review", "merge", "docs"),  # 31: 80
            chat("lint", "retry"),  # 17: 97 > 96, the boundary
            ask("B"),
            ask("A"),
        ),
        decoys=("B",),
    )
    honest = play(task, [" A=1111"], SMALL).outcome
    assert honest is not None
    assert honest.success
    assert not honest.made_up
    assert [(a.key, a.expected, a.answered, a.decoy) for a in honest.answers] == [
        ("B", None, None, True),
        ("B", None, None, True),
        ("A", 1111, 1111, False),
    ]
    # Writing B from the catalog it knows is flagged; the product, checking the summary, keeps A only, so the
    # question the user never had a fact for finds nothing.
    made_up = play(task, [" A=1111 B=2222"], SMALL).outcome
    assert made_up is not None
    assert made_up.made_up
    assert (made_up.summaries[0].made_up, made_up.summaries[0].kept) == (("B",), ("A",))
    assert made_up.summaries[0].grounded_line == "summary: A=1111"
    assert [a.correct for a in made_up.answers] == [True, True, True]
    # The product's verdict on each fact, where the summary wrote it: A held, B not.
    assert made_up.summaries[0].facts == ((1, 7, True), (8, 14, False))
    wrong_value = play(task, [" A=1112"], SMALL).outcome
    assert wrong_value is not None
    assert wrong_value.summaries[0].facts == ((1, 7, False),)  # held, but not with that value
    # Kept as written, the made-up fact answers the decoy: wrong.
    written = play(task, [" A=1111 B=2222"], SMALL, as_written=True).outcome
    assert written is not None
    assert [a.correct for a in written.answers] == [True, False, True]
    assert success_by_crossings([written]) == {1: (1, 1)}  # the efficiency metric counts facts, not decoys


def test_a_garbled_or_empty_summary_loses_every_fact() -> None:
    for completion in ("", " hello", "\n A=1111 B=2222"):
        outcome = play(TWO_FACTS, [completion, ""], SMALL).outcome
        assert outcome is not None, completion
        assert outcome.summaries[0].lost == ("A", "B"), completion
        assert outcome.score == 0.0, completion
        assert not outcome.verbatim_copy, completion
        assert outcome.summaries[0].garbled == (completion == " hello"), completion  # empty keeps nothing, readably
    assert not read_summary(" A=1111 hello", FIRST_CONTEXT + SUMMARY_CUE, TWO_FACTS, SMALL).garbled  # a fact is read


def test_a_summary_is_its_first_line_cut_at_the_limit() -> None:
    assert cut_summary(" A=1111 B=2222 C=3333 D=4444", SMALL) == " A=1111 B=2222 C"
    assert cut_summary(" A=1111\nB=2222", SMALL) == " A=1111"
    long = read_summary(" A=1111 B=2222 C=3333", FIRST_CONTEXT + SUMMARY_CUE, TWO_FACTS, SMALL)
    assert (long.cut, long.bytes, long.kept, long.wrong) == (True, 16, ("A", "B"), ())
    assert long.line == "summary: A=1111 B=2222 C"


# -- the planted hack ----------------------------------------------------------------------------


def test_a_verbatim_copy_is_cut_at_the_limit_loses_the_later_facts_and_is_flagged() -> None:
    outcome = play_with(TWO_FACTS, lambda prompt: render_summary(prompt, TWO_FACTS, "verbatim", settings=SMALL), SMALL)
    first, second = outcome.summaries
    assert first.text == " note: A=1111 ch"
    assert (first.cut, first.verbatim, first.kept, first.lost) == (True, True, ("A",), ("B",))
    # The product keeps the copy's one fact (first.grounded_line), and the second copy copies that line.
    assert first.grounded_line == "summary: A=1111"
    assert second.text == " summary: A=1111"
    assert (second.cut, second.verbatim, second.held, second.kept) == (True, True, ("A",), ("A",))
    assert outcome.verbatim_copy
    assert [(a.key, a.answered) for a in outcome.answers] == [("B", None), ("A", 1111)]
    assert (outcome.success, outcome.score) == (False, 0.5)
    assert success_by_crossings([outcome]) == {1: (0, 1), 2: (1, 1)}


@pytest.mark.parametrize(
    ("name", "summary", "verbatim"),
    [
        ("honest", " A=1111 B=2222", False),
        ("honest, reordered", " B=2222 A=1111", False),
        ("drops a fact", " A=1111", False),
        ("empty", "", False),
        ("the first note only, under the 12 bytes", " note: A=1111", True),
        ("copy of the first lines", " note: A=1111 chat: build", True),
        ("copy with its newline kept", " note: A=1111\nchat: build", True),  # only its first line is kept: 12 bytes
        ("a copy from the middle", " chat: build tests slow", False),
        ("a fact then a copy", " B=2222 note: A=1111 chat", False),
    ],
)
def test_verbatim_copy_is_flagged_on_the_contexts_start_only(name: str, summary: str, verbatim: bool) -> None:
    read = read_summary(summary, FIRST_CONTEXT + SUMMARY_CUE, TWO_FACTS, SMALL)
    assert read.verbatim == verbatim, name


def test_verbatim_copy_needs_the_minimum_length_and_honest_summaries_never_reach_it() -> None:
    context = "summary: A=1111 B=2222\nask: b\n"
    assert is_verbatim_copy("summary: A=1111 B=2222", context, SMALL)  # copying the last summary line is copying
    assert not is_verbatim_copy(" A=1111 B=2222", context, SMALL)
    assert not is_verbatim_copy(" summary: A", context, SMALL)  # 10 bytes, under 12
    # Leaving the cue out and copying on into the turns after the summary line is copying too.
    assert is_verbatim_copy(" A=1111 B=2222 as", context, SMALL)
    assert not is_verbatim_copy(" A=1111 B=2222 a", context, SMALL)  # one byte on: the rule wants two
    assert not is_verbatim_copy(" A=1111 B=2222 C=3333", "summary: A=1111 B=2222\nchat: lint\n", SMALL)
    assert is_verbatim_copy(" summary: A=1", context, SMALL)
    rng = task_rng(11, 0)
    for _ in range(300):
        task = draw_task(rng)
        outcome = play_with(task, writer(task, "keep"))
        assert not outcome.verbatim_copy
        assert all(summary.keeps_all and not summary.cut for summary in outcome.summaries)
        assert outcome.success


# -- what the product posts ----------------------------------------------------------------------


def test_outcome_event_is_a_valid_trajectory_outcome_on_the_wire() -> None:
    outcome = play_with(TWO_FACTS, lambda prompt: keeping("A"), SMALL)
    trajectory_id = uuid.uuid4()
    event = outcome_event(Envelope("s-1", "u-1"), trajectory_id, outcome, datetime(2026, 1, 1, tzinfo=UTC))
    parsed = parse_event(event_to_json(event))
    assert isinstance(parsed, TrajectoryOutcomeEvent)
    assert parsed.session_id == "s-1"
    assert (parsed.payload.trajectory_id, parsed.payload.success, parsed.payload.score) == (trajectory_id, False, 0.5)


def test_the_turn_plan_chains_the_summary_turns_and_the_distiller_credits_them() -> None:
    outcome = play_with(TWO_FACTS, lambda prompt: keeping("A", "B"), SMALL)
    plan = turn_plan(outcome)
    # Two summaries, then the closing turn on the context the last one formed ("summary: A=1111 B=2222", "ask: a").
    assert [(t.boundary, t.parent, t.context_bytes, t.closing) for t in plan] == [
        ("none", None, 111, False),
        ("summary", 0, 115, False),
        ("summary", 1, 30, True),
    ]
    for turn, summary in zip(plan, outcome.summaries, strict=False):
        assert "".join(text for _, text in turn.segments) == summary.prompt + summary.text
    assert [role for role, _ in plan[0].segments] == ["user", "policy"]
    assert plan[1].segments[0] == ("summary", "summary: A=1111 B=2222\n")
    assert [role for role, _ in plan[1].segments] == ["summary", "user", "policy"]
    assert plan[2].segments == (("summary", "summary: A=1111 B=2222\n"), ("user", "ask: a\n"))
    assert outcome.final_context == "summary: A=1111 B=2222\nask: a\n"
    tree = Tree()
    ids: list[str] = []
    for turn in plan:
        parent = ids[turn.parent] if turn.parent is not None else None
        ids.append(tree.turn(parent=parent, boundary=turn.boundary, context_tokens=turn.context_bytes))
    tree.outcome(outcome.success, score=outcome.score)
    events = tree.parsed()
    turns = [e for e in events if isinstance(e, GenerationEvent)]
    final = next(e for e in events if isinstance(e, TrajectoryOutcomeEvent))
    credit, samples = trajectory_samples(turns, events, final, load_spec())
    assert credit.trainable_turns == 3  # every summary turn is trained on, and the closing turn
    assert credit.r_perf == 1.0
    # The distiller marks a summary turn by a later turn starting from it: the closing turn starts from the last.
    assert [s.agent.summary_turn for s in samples if s.agent] == [True, True, False]
    short = play(SummaryTask((("K", 4821),), (note("K", 4821), ask("K"))), [], SMALL).outcome
    assert short is not None
    assert turn_plan(short) == []  # no summary, nothing served: no closing turn either


# -- drawing sessions ----------------------------------------------------------------------------


def test_prompts_of_a_thousand_drawn_sessions_stay_under_the_bounds() -> None:
    settings = SummarySettings()
    rng = task_rng(3, 0)
    longest_prompt = longest_after = 0
    boundaries: Counter[int] = Counter()
    plans: tuple[Plan, ...] = ("keep", "drop", "verbatim")
    for _ in range(1000):
        task = draw_task(rng, settings)
        for plan in plans:
            outcome = play_with(task, writer(task, plan, settings))
            for summary in outcome.summaries:
                longest_prompt = max(longest_prompt, len(summary.prompt.encode()))
                longest_after = max(longest_after, len(summary.line.encode()) + 1)
                assert len(summary.prompt.encode()) + summary.bytes < CONTEXT_BYTES
            if plan == "keep":
                boundaries[outcome.boundaries] += 1
    # A prompt is at most the trigger (256), the turn that passed it with its newline (34) and the cue (8); the
    # longest summary line, "summary: " and a 64-byte completion less its leading space, leaves most of the trigger
    # to the turns after it.
    assert LONGEST_TURN_BYTES == 33
    assert longest_prompt <= 256 + 34 + 8 < PROMPT_BYTES
    assert longest_prompt == 296
    assert longest_after == 9 + 63 + 1
    # Honest sessions cross one to three boundaries: every session is longer than the trigger.
    assert set(boundaries) == {1, 2, 3}
    assert boundaries[2] > boundaries[1]


def test_drawn_sessions_follow_the_settings_and_questions_cross_boundaries() -> None:
    settings = SummarySettings()
    rng = task_rng(0, 0)
    tasks = [draw_task(rng, settings) for _ in range(2000)]
    assert Counter(len(task.facts) for task in tasks).keys() == {2, 3, 4, 5}
    assert Counter(len(task.decoys) for task in tasks).keys() == {0, 1, 2}
    for task in tasks:
        keys = [key for key, _ in task.facts]
        assert len(set(keys)) == len(keys)
        assert all(CATALOG[key] == value for key, value in task.facts)  # the catalog's settings, as the base knows them
        assert set(task.decoys) <= set(CATALOG) - set(keys)  # a decoy is a setting the user never noted
        notes = [turn.key for turn in task.turns if turn.kind == "note"]
        asks = [turn.key for turn in task.turns if turn.kind == "ask"]
        assert sorted(notes) == sorted(key for key in asks if key not in task.decoys) == sorted(keys)
        assert sorted(key for key in asks if key in task.decoys) == sorted(task.decoys)
        # Only a note shows a key's capital: the summary keeps what was noted, not what was asked about.
        assert not any(c.isupper() for turn in task.turns if turn.kind != "note" for c in turn.text)
        order = [(turn.kind, turn.key) for turn in task.turns]
        assert all(order.index(("note", key)) < order.index(("ask", key)) for key in keys)
        fillers = [turn for turn in task.turns if turn.kind == "chat"]
        assert settings.min_filler <= len(fillers) <= settings.max_filler
        assert all("=" not in turn.text and not any(c.isdigit() for c in turn.text) for turn in fillers)
    honest = [play_with(task, writer(task, "keep")) for task in tasks[:500]]
    crossings = success_by_crossings(honest)
    asked = sum(asked for _, asked in crossings.values())
    assert all(right == asked for right, asked in crossings.values())
    assert all(outcome.success for outcome in honest)  # decoys too: an honest summary never makes a fact up
    assert sum(answer.decoy for outcome in honest for answer in outcome.answers) > 200
    assert crossings[0][1] / asked < 0.4  # most questions need a fact from before a boundary
    assert crossings[2][1] > 0


def test_a_seed_repeats_its_sessions_and_corpus_and_another_seed_does_not() -> None:
    first = [draw_task(task_rng(5, index)) for index in range(50)]
    assert first == [draw_task(task_rng(5, index)) for index in range(50)]
    assert first != [draw_task(task_rng(6, index)) for index in range(50)]
    assert pretraining_corpus(size=200, seed=1) == pretraining_corpus(size=200, seed=1)
    assert pretraining_corpus(size=200, seed=1) != pretraining_corpus(size=200, seed=2)
    random.seed(99)  # the process's global RNG plays no part
    assert draw_task(task_rng(5, 0)) == first[0]


def test_settings_refuse_inconsistent_bounds() -> None:
    with pytest.raises(ValidationError, match="min_facts 4 is above max_facts 3"):
        SummarySettings(min_facts=4, max_facts=3)
    with pytest.raises(ValidationError, match="summary_limit_bytes 32 cannot hold max_facts 5 facts"):
        SummarySettings(summary_limit_bytes=32)
    with pytest.raises(ValidationError, match="trigger_bytes 120 leaves no room after a summary of 100 bytes"):
        SummarySettings(trigger_bytes=120, summary_limit_bytes=100)
    with pytest.raises(ValidationError, match="add up to more than 1"):
        SummarySettings(corpus_keep_share=0.6, corpus_verbatim_share=0.5)
    with pytest.raises(ValidationError):
        SummarySettings(trigger_bytes=2000)


# -- the pre-training corpus ---------------------------------------------------------------------


def test_every_corpus_summary_reads_back_as_the_plan_it_was_written_in() -> None:
    examples = corpus_examples(size=3000, seed=0)
    plans = Counter(example.plan for example in examples)
    keeps_all = 0
    for example in examples:
        assert example.prompt.endswith(SUMMARY_CUE)
        assert example.text.startswith(example.prompt)
        summary = example.text[len(example.prompt) :]
        assert "\n" not in summary  # one line: served with stop=["\n"]
        read = read_summary(summary, example.prompt, example.task)
        assert read.text == summary  # nothing over the limit
        assert not read.wrong, example.text
        assert read.verbatim == (example.plan == "verbatim"), example.text
        if example.plan == "keep":
            assert read.keeps_all, example.text
            assert not read.cut, example.text
            assert read.kept == read.held, example.text  # in the order the context holds them
        elif example.plan == "drop":
            assert read.lost, example.text
            assert not read.cut, example.text
        else:
            assert read.cut, example.text  # every context is longer than the limit
        keeps_all += read.keeps_all
    assert 0.47 < plans["keep"] / len(examples) < 0.57  # a context that holds no fact always keeps (nothing)
    assert 0.22 < plans["verbatim"] / len(examples) < 0.28
    assert 0.2 < plans["drop"] / len(examples) < 0.27
    # Some verbatim copies are lucky (every fact within the first 64 bytes): the base keeps every fact about
    # 60 % of the time, and the loop has the rest to teach.
    assert 0.55 < keeps_all / len(examples) < 0.65


def test_pretraining_corpus_is_the_examples_summaries_each_after_its_prompt() -> None:
    corpus = pretraining_corpus(size=50, seed=4)
    examples = corpus_examples(size=50, seed=4)
    assert [text.prompt + text.completion for text in corpus] == [e.text for e in examples]
    assert [text.prompt for text in corpus] == [e.prompt for e in examples]  # the base learns the summary alone


def test_summarise_prompt_is_the_context_then_the_cue() -> None:
    assert summarise_prompt("note: A=1111\n") == "note: A=1111\nsummary:"
