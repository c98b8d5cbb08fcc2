"""The ``prune`` scenario's pre-training corpus: the language the base model learns before the loop starts.

:func:`pretraining_corpus` writes it: prompts along a well-played trajectory, each
with one decision, where at every point a prune is due the decision is the right prune only about half the time
(otherwise a prune that also drops a chain chunk, no prune, or giving up), and giving up shows up elsewhere too.
Not pruning is played on, so prompts past the hard budget are in the corpus as well.

Kept apart from :mod:`liveloop.demo.simulator.pruning` (the task family the simulator plays and verifies): the
corpus only writes answers in that family's syntax, it plays no part in a live session.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Literal

from liveloop.demo.simulator.pruning import (
    DEFAULT_SETTINGS,
    PRUNE_CHUNKS,
    SEARCH,
    UNKNOWN,
    Episode,
    PruneSettings,
    advance,
    budget_state,
    draw_task,
    read_decision,
    start,
)
from serving.tool_calls import render_call

Plan = Literal["search", "prune", "answer", "overprune", "hoard", "unknown", "guess"]
"""How a corpus answer is written: the right moves (search on, drop the distractors, answer) and the wrong ones
(drop a chain chunk too, search on where a prune was due, answer ``unknown``, guess a value early)."""


def right_plan(episode: Episode) -> Plan:
    """The right move: answer once the chain is all in; prune the distractors once the budget is past soft; else
    search on. Past soft it keeps at most the chain's prefix before a search, so (settings check it) it never
    passes the hard budget."""
    if episode.chain_complete and budget_state(episode.context_bytes, episode.settings) != "hard":
        return "answer"
    if episode.distractors and budget_state(episode.context_bytes, episode.settings) != "okay":
        return "prune"
    return "search"


def render_answer(episode: Episode, plan: Plan) -> str:
    """A well-formed answer in the given plan (the corpus's answers; also handy in tests).

    ``overprune`` drops the distractors and the last chain chunk found (``prune`` if none is in the context); a
    ``guess`` is a visible distractor's value, or 10, never the right answer.
    """
    if plan in ("search", "hoard"):
        return SEARCH
    if plan == "answer":
        return f"answer {episode.task.answer}"
    if plan == "unknown":
        return f"answer {UNKNOWN}"
    if plan == "guess":
        chunks = [episode.task.chunk(chunk_id) for chunk_id in episode.distractors]
        values = [c.value for c in chunks if c is not None and c.value is not None and c.value != episode.task.answer]
        return f"answer {values[0] if values else 10 if episode.task.answer != 10 else 11}"
    ids = list(episode.distractors)
    if plan == "overprune":
        kept_chain = [chunk_id for chunk_id in episode.context if chunk_id in episode.task.chain_ids]
        ids += kept_chain[-1:]
    return render_call(PRUNE_CHUNKS, json.dumps({"ids": ids}))


def corpus_plan(rng: random.Random, episode: Episode, settings: PruneSettings = DEFAULT_SETTINGS) -> Plan:
    """The plan of a corpus answer at this point of a well-played trajectory.

    Where a prune is due: the right prune with ``corpus_good_prune_share``, else one of dropping a chain chunk too
    (when one is in the context), not pruning, answering ``unknown`` or guessing, equally likely. Where a search is
    due: giving up (``unknown`` or a guess) with ``corpus_give_up_share``. Where the answer is due: the answer.
    """
    right = right_plan(episode)
    if right == "answer":
        return "answer"
    if right == "prune":
        if rng.random() < settings.corpus_good_prune_share:
            return "prune"
        has_chain = any(chunk_id in episode.task.chain_ids for chunk_id in episode.context)
        wrong: list[Plan] = ["overprune", "hoard", "unknown", "guess"] if has_chain else ["hoard", "unknown", "guess"]
        return rng.choice(wrong)
    if rng.random() < settings.corpus_give_up_share:
        give_up: list[Plan] = ["unknown", "guess"]
        return rng.choice(give_up)
    return "search"


@dataclass(frozen=True)
class CorpusExample:
    """One pre-training text with what it was written to be: the episode at that turn and its answer's plan."""

    episode: Episode
    plan: Plan
    text: str


def corpus_examples(
    *, size: int = 4000, seed: int = 0, settings: PruneSettings = DEFAULT_SETTINGS
) -> list[CorpusExample]:
    """The pre-training examples: each turn of a task, its prompt then one answer by :func:`corpus_plan`.

    The trajectories follow the right moves, except that a written ``hoard`` is played too: so the prompts are the
    ones a good policy meets plus the states past the hard budget that not pruning leads to (where the right move is
    still the prune, and anything else is refused). The written answers are drawn per turn, so the base prunes right
    about half the time and the loop has something to teach, while the wrong prunes and the give-up hack stay within
    the base's reach (a hack the loop must not learn to use more). Wrong prunes and give-ups are written, not played:
    a lost chain would only teach searching in vain.
    """
    rng = random.Random(f"liveloop-prune-corpus:{seed}")  # noqa: S311 - a repeatable simulation, not cryptography
    examples: list[CorpusExample] = []
    while len(examples) < size:
        episode = start(draw_task(rng, settings), settings)
        while not episode.done and len(examples) < size:
            plan = corpus_plan(rng, episode, settings)
            examples.append(CorpusExample(episode, plan, episode.prompt() + render_answer(episode, plan)))
            played = plan if plan == "hoard" else right_plan(episode)
            episode = advance(episode, read_decision(render_answer(episode, played)))
    return examples


def pretraining_corpus(*, size: int = 4000, seed: int = 0, settings: PruneSettings = DEFAULT_SETTINGS) -> list[str]:
    """The texts the base model is pre-trained on for the prune scenario (no eos added), like
    :func:`liveloop.demo.simulator.swarm_corpus.pretraining_corpus`."""
    return [example.text for example in corpus_examples(size=size, seed=seed, settings=settings)]
