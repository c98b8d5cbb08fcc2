"""The ``summary`` scenario's pre-training corpus: the language the base model learns before the loop starts.

:func:`pretraining_corpus` writes it: summarise prompts from played sessions and
summaries that keep every fact (half), drop some, or copy the context verbatim, so that the base keeps the right
facts only about half the time and the loop has something to teach. The texts are prompted: the base learns the
summaries, not the contexts (see :func:`pretraining_corpus`).

Kept apart from :mod:`liveloop.demo.simulator.summaries` (the task family the simulator plays and verifies): the
corpus only writes summaries in that family's language, it plays no part in a live session.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from learner.pretrain import Prompted
from liveloop.demo.simulator.summaries import (
    DEFAULT_SETTINGS,
    SUMMARY_CUE,
    SummarySettings,
    SummaryTask,
    cut_summary,
    draw_task,
    facts_held,
    play,
)

Plan = Literal["keep", "drop", "verbatim"]
"""How a corpus summary is written: every fact the context holds, some of them dropped, or a verbatim copy."""


def render_summary(
    prompt: str,
    task: SummaryTask,
    plan: Plan,
    rng: random.Random | None = None,
    settings: SummarySettings = DEFAULT_SETTINGS,
) -> str:
    """A summary completion of ``prompt`` in the given plan (the corpus's summaries; also handy in tests).

    Facts are written in catalog order. ``drop`` keeps a random strict subset of the held facts (``rng`` draws
    it; the last one held is dropped without one). ``verbatim`` copies the context's lines, one space apart, cut at
    the summary's limit.
    """
    context = prompt.removesuffix(SUMMARY_CUE)
    held = facts_held(context, task)
    if plan == "verbatim":
        return cut_summary(" " + " ".join(context.split()), settings)  # whitespace collapsed, as a copy reads
    kept = list(held)
    if plan == "drop" and held:
        kept = rng.sample(held, rng.randint(0, len(held) - 1)) if rng else kept[:-1]
    # Catalog order: what to write next is the next noted key after the last one written, wherever it was noted.
    return "".join(f" {key}={task.value(key)}" for key in sorted(kept))


def corpus_plan(rng: random.Random, held: int, settings: SummarySettings = DEFAULT_SETTINGS) -> Plan:
    """The plan of a corpus summary; with no fact held, dropping one is impossible and it keeps (nothing)."""
    draw = rng.random()
    if draw < settings.corpus_keep_share:
        return "keep"
    if draw < settings.corpus_keep_share + settings.corpus_verbatim_share:
        return "verbatim"
    return "drop" if held else "keep"


@dataclass(frozen=True)
class CorpusExample:
    """One pre-training text with what it was written to be: its session, its prompt and its summary's plan."""

    task: SummaryTask
    prompt: str
    plan: Plan
    text: str


def corpus_examples(
    *, size: int = 4000, seed: int = 0, settings: SummarySettings = DEFAULT_SETTINGS
) -> list[CorpusExample]:
    """The pre-training examples: summarise prompts met while playing drawn sessions, each with a summary drawn by
    :func:`corpus_plan` (so the contexts after a bad summary, which lost facts, are in the corpus too)."""
    rng = random.Random(f"liveloop-summary-corpus:{seed}")  # noqa: S311 - a repeatable simulation, not cryptography
    examples: list[CorpusExample] = []
    while len(examples) < size:
        task = draw_task(rng, settings)
        written: list[str] = []
        while len(examples) < size:
            step = play(task, written, settings, as_written=True)  # the corpus predates the product's check
            if step.next_prompt is None:
                break
            held = facts_held(step.next_prompt, task)
            plan = corpus_plan(rng, len(held), settings)
            summary = render_summary(step.next_prompt, task, plan, rng, settings)
            written.append(summary)
            examples.append(CorpusExample(task, step.next_prompt, plan, step.next_prompt + summary))
    return examples


def pretraining_corpus(
    *, size: int = 4000, seed: int = 0, settings: SummarySettings = DEFAULT_SETTINGS
) -> list[Prompted]:
    """The texts the base model is pre-trained on for the summary scenario (no eos added), like
    :func:`liveloop.demo.simulator.swarm_corpus.pretraining_corpus` for the swarm scenario, but prompted: the base
    learns each summary, not the context before it.

    Why: over the whole text, nine tenths of the loss is the context's filler, which no model can predict, and the
    summary's few bytes taught the base next to nothing. Sampled as the demo serves them (temperature 1), bases
    pre-trained on whole texts kept 0.19 and 0.33 of the facts their contexts held and made one up in 0.76 and
    0.63 of their summaries (seeds 0 and 1); on the summaries alone, 0.67 and 0.69, and 0.08 and 0.06
    (docs/agent-learnability.md, "Pre-trained on its summaries")."""
    return [
        Prompted(example.prompt, example.text.removeprefix(example.prompt))
        for example in corpus_examples(size=size, seed=seed, settings=settings)
    ]
