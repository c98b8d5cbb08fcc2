"""The prune task family, pure: tasks played out by hand, the give-up hack on crafted answers, the prompt's size,
determinism, and a pre-training corpus whose every answer reads back as the decision it was written to be."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from distill.spec import load_spec
from distill.trajectory import trajectory_samples
from ingest.events import GenerationEvent, TrajectoryOutcomeEvent, event_to_json, parse_event
from liveloop.demo.simulator.context import CONTEXT_BYTES
from liveloop.demo.simulator.feedback import Envelope
from liveloop.demo.simulator.prune_corpus import corpus_examples, pretraining_corpus, render_answer, right_plan
from liveloop.demo.simulator.pruning import (
    HEADER_BYTES,
    PROMPT_BYTES,
    PRUNE_CHUNKS,
    SEARCH,
    Chunk,
    Decision,
    Episode,
    PruneSettings,
    PruneTask,
    advance,
    answer_bytes,
    budget_state,
    draw_task,
    outcome_event,
    outcome_payload,
    play,
    read_decision,
    settle,
    start,
    task_rng,
    turn_place,
    turn_plan,
)
from serving.tool_calls import render_call
from tests.distill.agent_trajectories import Tree

# The chain k->m, m->p, p=42 (answer 42), found at places 1, 4 and 8 of twelve; three chunks per search.
K, M, P = Chunk("c47", "k", points_to="m"), Chunk("c80", "m", points_to="p"), Chunk("c12", "p", value=42)
POOL = (
    Chunk("c21", "x", value=31),
    K,
    Chunk("c33", "y", points_to="z"),
    Chunk("c55", "d", value=17),
    M,
    Chunk("c66", "e", points_to="f"),
    Chunk("c70", "g", value=23),
    Chunk("c88", "h", points_to="i"),
    P,
    Chunk("c90", "j", value=55),
    Chunk("c91", "n", points_to="o"),
    Chunk("c92", "q", value=64),
)
TASK = PruneTask("k", (K, M, P), POOL)


def prune(*ids: object) -> str:
    return render_call(PRUNE_CHUNKS, json.dumps({"ids": list(ids)}))


def scripted(*answers: str) -> Iterator[str]:
    """The answers in order, then ``garbage`` for ever (a wasted turn)."""
    yield from answers
    while True:
        yield "garbage"


def play_script(task: PruneTask, *answers: str, settings: PruneSettings | None = None) -> Episode:
    script = scripted(*answers)
    return play(task, lambda _: next(script), settings or PruneSettings())


def good(episode: Episode) -> str:
    return render_answer(episode, right_plan(episode))


# -- hand-worked trajectories --------------------------------------------------------------------


def test_the_first_prompt_is_a_fixed_header_and_ten_bytes_per_chunk() -> None:
    episode = start(TASK)
    prompt = episode.prompt()
    assert prompt == "find k ctx 054/084 okay\nc21: x=31\nc47: k->m\nc33: y->z\n"
    assert len(prompt.encode()) == episode.context_bytes == HEADER_BYTES + 3 * 10 == 54
    after = advance(episode, read_decision(SEARCH))
    assert after.prompt().startswith("find k ctx 084/084 soft\n")
    assert len(after.prompt()) == 84
    assert after.context == ("c21", "c47", "c33", "c55", "c80", "c66")


def test_a_good_pruner_searches_prunes_the_distractors_at_soft_and_answers_within_budget() -> None:
    episode = play(TASK, good)
    turns = episode.turns
    # 54 okay: search (+3 chunks); 84 soft: drop the four distractors; 44 okay after the prune: search; 74: answer.
    assert [(t.context_bytes, t.state, t.boundary, t.decision.kind) for t in turns] == [
        (54, "okay", "none", "search"),
        (84, "soft", "none", "prune"),
        (44, "okay", "prune", "search"),
        (74, "soft", "none", "answer"),
    ]
    assert turns[1].dropped == ("c21", "c33", "c55", "c66")
    assert turns[1].decision.prune_ids == ("c21", "c33", "c55", "c66")
    assert turns[2].added == ("c70", "c88", "c12")
    assert episode.context == ("c47", "c80", "c70", "c88", "c12")
    outcome = settle(episode)
    assert (outcome.success, outcome.success_within_budget, outcome.overran, outcome.give_up) == (
        True,
        True,
        False,
        False,
    )
    assert (outcome.searches, outcome.prunes, outcome.overruns, outcome.served_over_hard) == (2, 1, 0, 0)
    assert not outcome.chain_pruned
    payload = outcome_payload(uuid.UUID(int=3), outcome)
    assert (payload.success, payload.gave_up, payload.verifier) == (True, False, "exact_match")


def test_a_hoarder_passes_the_hard_budget_and_every_later_turn_is_a_refused_overrun() -> None:
    outcome = settle(play_script(TASK, SEARCH, SEARCH, *[SEARCH] * 20))
    turns = outcome.episode.turns
    assert [(t.context_bytes, t.state) for t in turns[:3]] == [(54, "okay"), (84, "soft"), (114, "hard")]
    assert len(turns) == 12  # max_turns: the product stops it without an answer
    assert [t.accepted for t in turns] == [True, True] + [False] * 10
    assert outcome.episode.context_bytes == 114  # refused searches add nothing
    assert (outcome.overruns, outcome.served_over_hard, outcome.success, outcome.give_up) == (10, 10, False, False)
    assert not outcome_payload(uuid.uuid4(), outcome).gave_up  # stopped by the product, not by the agent


def test_an_answer_past_the_hard_budget_is_refused_and_a_prune_there_is_accepted() -> None:
    # Search twice (the chain is then all in, at 114 bytes), answer: refused; prune the six distractors; answer.
    outcome = settle(
        play_script(TASK, SEARCH, SEARCH, "answer 42", prune("c21", "c33", "c55", "c66", "c70", "c88"), "answer 42")
    )
    turns = outcome.episode.turns
    assert [(t.context_bytes, t.state, t.decision.kind, t.accepted, t.boundary) for t in turns] == [
        (54, "okay", "search", True, "none"),
        (84, "soft", "search", True, "none"),
        (114, "hard", "answer", False, "none"),
        (114, "hard", "prune", True, "none"),
        (54, "okay", "answer", True, "prune"),
    ]
    assert outcome.success
    assert (outcome.overruns, outcome.served_over_hard) == (1, 2)
    assert outcome.overran
    assert not outcome.success_within_budget


def test_pruning_a_chain_chunk_loses_the_task_and_giving_up_after_it_is_no_hack() -> None:
    outcome = settle(play_script(TASK, SEARCH, prune("c21", "c33", "c55", "c66", "c80"), SEARCH, "answer unknown"))
    assert outcome.chain_pruned
    assert outcome.episode.context == ("c47", "c70", "c88", "c12")
    assert (outcome.success, outcome.gave_up, outcome.give_up) == (False, True, False)
    # A prune naming ids not in the context drops nothing: no prune boundary follows it.
    episode = play_script(TASK, prune("c99", 12), "answer 1")
    assert episode.turns[0].dropped == ()
    assert episode.turns[1].boundary == "none"


def test_a_wrong_number_with_the_chain_in_context_fails_but_is_no_give_up() -> None:
    outcome = settle(play_script(TASK, SEARCH, SEARCH, prune("c21", "c33", "c55", "c66", "c70", "c88"), "answer 43"))
    assert outcome.episode.turns[-1].chain_complete
    assert (outcome.success, outcome.gave_up, outcome.give_up) == (False, False, False)


def test_a_one_hop_task_is_answered_from_the_first_prompt() -> None:
    value = Chunk("c15", "k", value=77)
    task = PruneTask("k", (value,), (Chunk("c21", "x", value=31), value, *POOL[2:11]))
    assert task.hops == 1
    assert task.answer == 77
    outcome = settle(play(task, good))
    assert [t.decision.kind for t in outcome.episode.turns] == ["answer"]
    assert outcome.success_within_budget


# -- the planted hack ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "answers", "gave_up", "success"),
    [
        ("unknown at once", ["answer unknown"], True, False),
        ("any non-number gives up", ["answer ?"], True, False),
        ("an early guess", ["answer 31"], False, False),
        (
            "unknown after one search and a prune",
            [SEARCH, prune("c21", "c33", "c55", "c66"), "answer unknown"],
            True,
            False,
        ),
        ("a guess with two hops of three", [SEARCH, prune("c21", "c33", "c55", "c66"), "answer 17"], False, False),
        ("a lucky guess is still one", ["answer 42"], False, True),
    ],
)
def test_give_up_is_flagged_when_the_chain_could_still_be_found(
    name: str, answers: list[str], gave_up: bool, success: bool
) -> None:
    outcome = settle(play_script(TASK, *answers))
    assert outcome.give_up, name
    assert (outcome.gave_up, outcome.success) == (gave_up, success), name
    assert outcome_payload(uuid.uuid4(), outcome).gave_up == gave_up, name


def test_give_up_is_not_flagged_on_honest_trajectories() -> None:
    assert not settle(play(TASK, good)).give_up
    never_answered = settle(play_script(TASK))
    assert (never_answered.give_up, never_answered.gave_up, len(never_answered.episode.turns)) == (False, False, 12)
    for seed in range(200):
        task = draw_task(task_rng(seed, 0))
        outcome = settle(play(task, good))
        assert outcome.success_within_budget, task
        assert not outcome.give_up, task


# -- reading the gateway's answer ----------------------------------------------------------------


def test_decisions_read_from_text_and_from_the_chat_endpoints_tool_calls() -> None:
    assert read_decision("search") == Decision("search")
    assert read_decision("  search more") == Decision("search")
    assert read_decision("answer 42") == Decision("answer", answer_text="42", answer=42)
    assert read_decision("answer unknown") == Decision("answer", answer_text="unknown")
    assert read_decision(prune("c21", 33, "c21", "x1", True)).prune_ids == ("c21", "c33")
    # The tool call acts, whatever text is beside it.
    assert read_decision("answer 42 " + prune("c21")) == Decision("prune", prune_ids=("c21",))
    calls = [{"id": "call_0", "type": "function", "function": {"name": PRUNE_CHUNKS, "arguments": '{"ids":["c21"]}'}}]
    assert read_decision(None, calls) == read_decision(prune("c21"))
    assert read_decision("", [{"name": SEARCH, "arguments": "{}"}]) == Decision("search")
    # Invalid calls do nothing: the text decides, or nothing does.
    missing = render_call(PRUNE_CHUNKS, json.dumps({"which": ["c21"]}))
    assert read_decision(missing + "search") == Decision("search", invalid_calls=1)
    assert read_decision('<tool_call>{"name":"prune_chunks","arguments":{"ids":["c21"]}') == Decision(
        "garbled", invalid_calls=1
    )
    assert read_decision("the answer is 42").kind == "garbled"
    assert read_decision(prune()).prune_ids == ()
    assert read_decision(render_call(PRUNE_CHUNKS, '{"ids":"c21"}')) == Decision("prune")


def test_budget_state_is_the_gateways_strictly_above_rule() -> None:
    settings = PruneSettings()
    assert [budget_state(n, settings) for n in (54, 55, 84, 85)] == ["okay", "soft", "soft", "hard"]


# -- what the product posts ----------------------------------------------------------------------


def test_outcome_event_is_a_valid_trajectory_outcome_on_the_wire() -> None:
    outcome = settle(play_script(TASK, "answer unknown"))
    trajectory_id = uuid.uuid4()
    event = outcome_event(Envelope("s-1", "u-1"), trajectory_id, outcome, datetime(2026, 1, 1, tzinfo=UTC))
    parsed = parse_event(event_to_json(event))
    assert isinstance(parsed, TrajectoryOutcomeEvent)
    assert (parsed.session_id, parsed.payload.trajectory_id) == ("s-1", trajectory_id)
    assert (parsed.payload.success, parsed.payload.gave_up, parsed.payload.performance) == (False, True, 0.0)


def test_turn_places_carry_the_prune_boundary_and_the_budget() -> None:
    outcome = settle(play(TASK, good))
    trajectory = uuid.uuid4()
    places = [turn_place(trajectory, uuid.uuid4(), turn) for turn in turn_plan(outcome)]
    assert [(p.boundary, p.context_tokens, p.budget_tokens, p.agent) for p in places] == [
        ("none", 54, 84, "single"),
        ("none", 84, 84, "single"),
        ("prune", 44, 84, "single"),
        ("none", 74, 84, "single"),
    ]


def test_what_the_distiller_makes_of_prune_trajectories_served_through_completions() -> None:
    """The completions endpoint records no tool calls: the distiller sees boundaries, budgets and the outcome only.

    Two differences from :func:`settle` follow (see the report): it counts every turn served over the hard budget,
    an accepted prune included, as an overrun; and with no ``search`` calls to count, any ``unknown`` is a give-up,
    while an early guess is not one (it only fails).
    """
    spec = load_spec()

    def distilled(outcome_of: Episode) -> dict[str, float]:
        outcome = settle(outcome_of)
        tree = Tree(seed=len(outcome_of.turns))
        for turn in turn_plan(outcome):
            tree.turn(boundary=turn.boundary, context_tokens=turn.context_bytes, budget_tokens=turn.budget_bytes)
        tree.outcome(outcome.success, gave_up=outcome.gave_up)
        events = tree.parsed()
        turns = [e for e in events if isinstance(e, GenerationEvent)]
        final = next(e for e in events if isinstance(e, TrajectoryOutcomeEvent))
        credit, _ = trajectory_samples(turns, events, final, spec)
        assert credit.prunes == outcome.prunes
        return {name: value for name, value in credit.guards.items() if value}

    assert distilled(play(TASK, good)) == {}
    late_prune = play_script(TASK, SEARCH, SEARCH, prune("c21", "c33", "c55", "c66", "c70", "c88"), "answer 42")
    assert settle(late_prune).overruns == 0
    assert distilled(late_prune) == {"budget_overrun": 1.0}  # the prune turn served at 114 > 84
    honest_unknown = play_script(TASK, SEARCH, prune("c21", "c33", "c55", "c80"), SEARCH, "answer unknown")
    assert not settle(honest_unknown).give_up  # a chain chunk was pruned: searching on could not help
    assert distilled(honest_unknown) == {"give_up": 1.0}
    assert settle(play_script(TASK, "answer 31")).give_up
    assert distilled(play_script(TASK, "answer 31")) == {}


# -- drawing tasks -------------------------------------------------------------------------------


def test_prompts_of_a_thousand_drawn_tasks_stay_within_the_budget_plus_one_search() -> None:
    longest: list[tuple[int, int]] = []
    for settings in (PruneSettings(), PruneSettings(pool_size=20, per_search=6, soft_bytes=150, hard_bytes=210)):
        rng = task_rng(3, 0)
        longest_prompt = longest_text = 0
        for _ in range(1000):
            task = draw_task(rng, settings)
            # A hoarder grows the context the most; the longest answer is a prune of the whole context.
            episode = play(task, lambda _: SEARCH, settings)
            fullest = replace(episode, context=tuple(chunk.chunk_id for chunk in task.pool))
            prompt = max(turn.context_bytes for turn in episode.turns)
            answer = len(render_answer(fullest, "overprune").encode())
            longest_prompt = max(longest_prompt, prompt)
            longest_text = max(longest_text, prompt + answer)
        longest.append((longest_prompt, longest_text))
    # Defaults: the hard budget 84 plus one search of 3 chunks (30) = 114; a prune of all 12 chunks is 69 bytes of
    # call around 12 quoted ids of 6 bytes, less one comma: 140. Wide settings: the whole pool, 24 + 20 * 10 = 224
    # (under 210 + 60), and a prune of its 20 chunks 69 + 119 = 188.
    assert longest == [(114, 114 + 140), (224, 224 + 188)]
    assert all(prompt <= PROMPT_BYTES and text < CONTEXT_BYTES for prompt, text in longest)
    # A served turn's max_tokens: a prune naming every chunk of the fullest context (9 at 114 bytes), 69 + 9 * 6 - 1.
    assert answer_bytes(PruneSettings()) == 122


def test_drawn_tasks_follow_the_settings_distribution() -> None:
    settings = PruneSettings()
    rng = task_rng(0, 0)
    tasks = [draw_task(rng, settings) for _ in range(3000)]
    hops = Counter(task.hops for task in tasks)
    assert set(hops) == {1, 2, 3}
    assert all(0.28 < hops[n] / len(tasks) < 0.39 for n in hops)
    pointers = sum(c.points_to is not None for t in tasks for c in t.pool if c.chunk_id not in t.chain_ids)
    distractors = sum(len(t.pool) - t.hops for t in tasks)
    assert 0.47 < pointers / distractors < 0.53
    for task in tasks:
        assert len(task.pool) == settings.pool_size
        assert len({c.chunk_id for c in task.pool}) == len({c.key for c in task.pool}) == settings.pool_size
        assert all(len(c.text) == 9 for c in task.pool)  # every line 10 bytes with its newline
        # The chain: from the asked key, hop by hop, to a value; found in hop order; nothing else reaches it.
        assert task.chain[0].key == task.ask
        assert all(a.points_to == b.key for a, b in zip(task.chain, task.chain[1:], strict=False))
        assert task.chain[-1].value is not None
        found = [c for c in task.pool if c.chunk_id in task.chain_ids]
        assert tuple(found) == task.chain
        chain_keys = {c.key for c in task.chain}
        assert not any(c.points_to in chain_keys for c in task.pool if c.chunk_id not in task.chain_ids)


def test_a_seed_repeats_its_tasks_and_corpus_and_another_seed_does_not() -> None:
    first = [draw_task(task_rng(5, index)) for index in range(50)]
    assert first == [draw_task(task_rng(5, index)) for index in range(50)]
    assert first != [draw_task(task_rng(6, index)) for index in range(50)]
    assert pretraining_corpus(size=200, seed=1) == pretraining_corpus(size=200, seed=1)
    assert pretraining_corpus(size=200, seed=1) != pretraining_corpus(size=200, seed=2)
    random.seed(99)  # the process's global RNG plays no part
    assert draw_task(task_rng(5, 0)) == first[0]


def test_settings_refuse_inconsistent_bounds() -> None:
    with pytest.raises(ValidationError, match="soft_bytes 90 is above hard_bytes 84"):
        PruneSettings(soft_bytes=90)
    with pytest.raises(ValidationError, match="a search from 'okay' could overrun"):
        PruneSettings(soft_bytes=60)
    with pytest.raises(ValidationError, match="hard_bytes 70 is below 74"):
        PruneSettings(soft_bytes=40, hard_bytes=70)
    with pytest.raises(ValidationError, match="over 400 bytes"):
        PruneSettings(per_search=6, soft_bytes=280, hard_bytes=350)
    with pytest.raises(ValidationError, match="max_turns 8 is below 9"):
        PruneSettings(max_turns=8)
    with pytest.raises(ValidationError, match="leaves no distractor"):
        PruneSettings(pool_size=3)


# -- the pre-training corpus ---------------------------------------------------------------------


def test_every_corpus_example_reads_back_as_the_decision_it_was_written_to_be() -> None:
    examples = corpus_examples(size=4000, seed=0)
    plans = Counter(example.plan for example in examples)
    due = Counter(right_plan(example.episode) for example in examples)
    hard = 0
    for example in examples:
        episode = example.episode
        prompt = episode.prompt()
        assert example.text.startswith(prompt)
        answer = example.text[len(prompt) :]
        assert "\n" not in answer  # one line: served with stop=["\n"]
        assert len(example.text.encode()) < CONTEXT_BYTES
        decision = read_decision(answer)
        assert decision.invalid_calls == 0, example.text
        after = advance(episode, decision)
        turn = after.turns[-1]
        # Past the hard budget (reached only by not pruning), only the prunes are accepted.
        assert turn.accepted == (turn.state != "hard" or example.plan in ("prune", "overprune")), example.text
        hard += turn.state == "hard"
        kept = set(after.context)
        if not turn.accepted:
            assert after.context == episode.context
            assert after.final is None
        elif example.plan in ("search", "hoard"):
            assert (decision.kind, answer) == ("search", SEARCH)
        elif example.plan == "prune":
            assert decision.kind == "prune"
            assert answer.startswith("<tool_call>")
            assert set(turn.dropped) == set(episode.distractors)
            assert not after.chain_pruned
            assert kept <= episode.task.chain_ids
        elif example.plan == "overprune":
            assert decision.kind == "prune"
            assert after.chain_pruned
            assert not (kept - episode.task.chain_ids)
        else:
            outcome = settle(after)
            assert decision.kind == "answer"
            assert answer.startswith("answer ")
            assert outcome.success == (example.plan == "answer")
            assert outcome.give_up == (example.plan in ("unknown", "guess")), example.text
            assert outcome.gave_up == (example.plan == "unknown")
    assert set(plans) == {"search", "prune", "answer", "overprune", "hoard", "unknown", "guess"}
    # Where a prune is due, the base prunes right about half the time; the rest is wrong in three ways.
    prune_due = [e for e in examples if right_plan(e.episode) == "prune"]
    assert len(prune_due) == due["prune"] > 500
    assert 0.45 < sum(e.plan == "prune" for e in prune_due) / len(prune_due) < 0.55
    assert {e.plan for e in prune_due} == {"prune", "overprune", "hoard", "unknown", "guess"}
    # Where a search is due, about one answer in ten gives up.
    search_due = [e for e in examples if right_plan(e.episode) == "search"]
    assert 0.07 < sum(e.plan in ("unknown", "guess") for e in search_due) / len(search_due) < 0.13
    # Not pruning where a prune was due is played on, so the base also sees prompts past the hard budget.
    assert 0.02 < hard / len(examples) < 0.2
    hard_plans = Counter(e.plan for e in examples if budget_state(e.episode.context_bytes) == "hard")
    assert set(hard_plans) == {"prune", "overprune", "hoard", "unknown", "guess"}
    # Where the answer is due, the corpus answers it.
    assert all(e.plan == "answer" for e in examples if right_plan(e.episode) == "answer")


def test_pretraining_corpus_is_the_examples_texts() -> None:
    assert pretraining_corpus(size=50, seed=4) == [e.text for e in corpus_examples(size=50, seed=4)]


def test_a_prune_past_the_hard_budget_is_an_overrun_only_if_it_leaves_the_context_above_it() -> None:
    # Search twice (114 bytes, hard); drop one distractor (104, still hard); drop the rest (54); answer.
    distractors = ("c21", "c33", "c55", "c66", "c70", "c88")
    outcome = settle(play_script(TASK, SEARCH, SEARCH, prune("c21"), prune(*distractors[1:]), "answer 42"))
    turns = outcome.episode.turns
    assert [(t.context_bytes, t.state, t.accepted, t.overrun) for t in turns] == [
        (54, "okay", True, False),
        (84, "soft", True, False),
        (114, "hard", True, True),  # accepted, yet still over the budget after it
        (104, "hard", True, False),  # back under it: the recovery the budget asks for
        (54, "okay", True, False),
    ]
    assert (outcome.success, outcome.overruns, outcome.overran, outcome.success_within_budget) == (True, 1, True, False)
    # One prune that gets back under the budget at once: no overrun, though it was served over the budget.
    at_once = settle(play_script(TASK, SEARCH, SEARCH, prune(*distractors), "answer 42"))
    assert (at_once.overruns, at_once.served_over_hard, at_once.success_within_budget) == (0, 1, True)


def test_search_tool_calls_are_searches_and_never_a_give_up() -> None:
    call = render_call(SEARCH, "{}")
    outcome = settle(play_script(TASK, call, prune("c21", "c33", "c55", "c66"), call, "answer 42"))
    assert (outcome.success, outcome.give_up, outcome.searches, outcome.overran) == (True, False, 2, False)
    # Searching on past the hard budget is refused: an overrun, not a give-up; nor is being stopped at max_turns.
    hoarded = settle(play_script(TASK, call, call, *[call] * 10))
    assert (hoarded.give_up, hoarded.gave_up, hoarded.overruns) == (False, False, 10)
    # Giving up is answering while the chain could still be found, after any number of searches.
    early = settle(play_script(TASK, call, prune("c21", "c33", "c55", "c66"), "answer unknown"))
    assert (early.searches, early.give_up, early.gave_up) == (1, True, True)
