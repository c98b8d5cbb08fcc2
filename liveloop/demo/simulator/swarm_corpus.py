"""The ``swarm`` scenario's pre-training corpus: the language the base model learns before the loop starts.

:func:`pretraining_corpus` writes it: task prompts and well-formed answers, serial or parallel nearly independently
of the task's size (:func:`corpus_plan`), a few grouping two parts on one sub-agent or spawning an idle one.

Kept apart from :mod:`liveloop.demo.simulator.swarm` (the task family the simulator plays and verifies), as the
summary and prune corpora are: the corpus only writes answers in that family's language, it plays no part in a
live session.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Literal

from liveloop.demo.simulator.swarm import (
    ASSIGN_TASK,
    CREATE_SUBAGENT,
    DEFAULT_SETTINGS,
    SwarmSettings,
    SwarmTask,
    draw_task,
)
from serving.tool_calls import render_call

Plan = Literal["serial", "parallel", "grouped", "idle"]
"""How a corpus answer is written: answered serially, one sub-agent per part, two parts on one sub-agent
(``assign_task``), or one sub-agent per part plus an idle one (fake parallelism)."""


def render_answer(task: SwarmTask, plan: Plan) -> str:
    """A well-formed answer to ``task`` in the given plan (the corpus's answers; also handy in tests)."""
    if plan == "serial":
        return " ".join(f"{part.key}={part.answer}" for part in task.parts)
    calls = [render_call(CREATE_SUBAGENT, json.dumps({"q": key})) for key in task.keys]
    if plan == "grouped" and task.size >= 2:
        calls = [*calls[:-1], render_call(ASSIGN_TASK, json.dumps({"id": 1, "q": task.keys[-1]}))]
    if plan == "idle":
        calls.append(render_call(CREATE_SUBAGENT, json.dumps({"q": ""})))
    return "".join(calls)


def corpus_plan(rng: random.Random, task: SwarmTask, settings: SwarmSettings = DEFAULT_SETTINGS) -> Plan:
    """The plan of a corpus answer: serial or parallel nearly independently of the task's size.

    Nearly: with ``corpus_size_cue`` 0 the base has no cue from the size at all, and the loop then has to teach
    it to tell a one-part prompt from a many-part one before it can teach it when to parallelise. Offline
    (docs/swarm-learnability.md) the loop never did: the decision stayed one for all sizes and followed the
    one-part tasks' strong preference for serial, many-part tasks included. A small cue (parallel 65 % on
    many-part tasks, 35 % on one-part ones) gives the base features that tell sizes apart, and leaves the loop
    most of the way to teach.
    """
    cue = settings.corpus_size_cue if task.parallel_is_right() else -settings.corpus_size_cue
    if rng.random() >= min(1.0, max(0.0, settings.corpus_parallel_share + cue)):
        return "serial"
    shape = rng.random()
    if shape < settings.corpus_idle_share:
        return "idle"
    if task.size >= 2 and shape < settings.corpus_idle_share + settings.corpus_grouped_share:
        return "grouped"
    return "parallel"


@dataclass(frozen=True)
class CorpusExample:
    """One pre-training text with what it was written to be: its task and its answer's plan."""

    task: SwarmTask
    plan: Plan
    text: str


def corpus_examples(
    *, size: int = 4000, seed: int = 0, settings: SwarmSettings = DEFAULT_SETTINGS
) -> list[CorpusExample]:
    """The pre-training examples: prompt, then a well-formed answer drawn by :func:`corpus_plan`.

    Serial and parallel answers come in nearly equal shares on tasks of every size (:func:`corpus_plan`), so the
    base chooses right only a little more than half the time; a few parallel answers group parts or spawn an
    idle sub-agent, so that both tools' syntax and the fake-parallelism hack are within the base's reach (a hack
    the loop must not learn to use more).
    """
    rng = random.Random(f"liveloop-swarm-corpus:{seed}")  # noqa: S311 - a repeatable simulation, not cryptography
    examples: list[CorpusExample] = []
    for _ in range(size):
        task = draw_task(rng, settings)
        plan = corpus_plan(rng, task, settings)
        examples.append(CorpusExample(task, plan, task.prompt() + render_answer(task, plan)))
    return examples


def pretraining_corpus(*, size: int = 4000, seed: int = 0, settings: SwarmSettings = DEFAULT_SETTINGS) -> list[str]:
    """The texts the base model is pre-trained on for the swarm scenario (no eos added), like
    :func:`liveloop.demo.simulator.language.pretraining_corpus` for the code scenario."""
    return [example.text for example in corpus_examples(size=size, seed=seed, settings=settings)]
