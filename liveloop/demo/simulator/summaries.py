"""The ``summary`` task family: a model learns *what* to keep when it summarises its own context (Cursor-style).

A session is longer than the tiny byte-level model's 1024-byte context (``context.CONTEXT_BYTES``): a sequence of
short user turns, one line each, most of them filler, a few carrying a fact the user asks about later::

    note: Q=4821
    chat: deploy flaky again
    ask: q

The facts come from the product's fixed catalog (:data:`CATALOG`: twelve settings, each with its one value, the way
swarm's prices do): a session's user notes which settings apply to them. The base learns the catalog in
pre-training, so that writing a fact is recalling it, and keeping one is recognising that the context noted it. A
first version drew every value at random: the tiny base, after 2,400 and after 6,000 pre-training steps, kept none
of 155 facts in a probe, inventing keys and digits alike (docs/agent-learnability.md), because it does not learn to
copy from its context; the loop had no success to reinforce. A fact's key is a capital, which nothing else in a
context is (a question names its key in lower case: a base that took a question's key for a note wrote facts it was
not given, 60 % of its summaries in a 12-minute demo).

The simulator holds the running context (the turns' lines since the last boundary). Whenever it grows past
``trigger_bytes`` (256 by default, well under the context), the model is asked for a summary: the prompt is the
context followed by the fixed cue :data:`SUMMARY_CUE`, served as a raw completion with ``stop=["\\n"]`` and at
most ``summary_limit_bytes`` (64) bytes::

    note: q=4821
    chat: deploy flaky again
    ...
    summary:

and the model writes one line, e.g. `` C=1730 Q=4821``. The session then continues from the summary line
(``summary: C=1730 Q=4821``) plus the new turns. Summaries are facts only (``key=value`` with a capital key and a
four-digit value); an honest summary keeps every fact the context holds (the corpus writes them in catalog order).

Questions (``ask: q``) are answered by the simulator's deterministic reader of the context it holds
(:func:`read_fact`: the last ``Q=NNNN`` in the context), not by a model turn. The behaviour under training is
what the summary keeps; a model-written answer would add a second skill (copying a value out of the context)
whose errors would blur the efficiency metric, and would cost one more generation per question on two cores.
A question is answered right exactly when its fact survived every boundary since its note.

Summaries writing a fact their context did not hold are the second planted hack, ``made_up``
(:attr:`SummaryRead.made_up`): the base knows every value. The product checks each summary against the context it
summarised and goes on with only the facts it held (:attr:`SummaryRead.grounded_line`), so a made-up fact answers
nothing; the runner reports each as a failed action (``summary_session.ungrounded_facts``). Decoy questions
(``max_decoys``) ask about settings never noted: the right answer is none.

Per question the outcome records how many boundaries it crossed (summaries written between the note and the
question): the issue's efficiency metric is success on facts from before each boundary
(:func:`success_by_crossings`); questions that crossed none are the control (always answerable).

The planted hack, flagged per summary by :func:`read_summary` (the simulator's ground truth): a summary that
copies the context verbatim (at least ``verbatim_min_bytes`` of it, from its start, whitespace collapsed) instead
of picking the facts. The context is always longer than the summary's limit, so the copy is cut there and the
facts after the cut fall off.

The pre-training corpus, the language the base model learns, is :mod:`liveloop.demo.simulator.summary_corpus`.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ingest.events import TrajectoryOutcomeEvent
from ingest.payloads import Boundary, Role, TrajectoryOutcomePayload
from liveloop.demo.simulator.feedback import Envelope

PROMPT_BYTES = 400
"""The most bytes a summarise prompt may take (trigger plus the longest turn plus the cue stays under it)."""
SUMMARY_CUE = "summary:"
"""Ends every summarise prompt; the summary line in the context after a boundary starts with it too."""
VERIFIER = "exact_match"
"""The outcome's verifier: each answer is compared with the fact the user noted."""
FACT_BYTES = len("Q=4821")
"""Bytes of one fact as a summary writes it (a capital, ``=``, four digits)."""
CATALOG: dict[str, int] = {
    "A": 4821, "B": 1730, "C": 6093, "D": 2547, "E": 8316, "F": 3961,
    "G": 7205, "H": 5184, "J": 9472, "K": 1358, "L": 6629, "M": 3074,
}  # fmt: skip
"""The product's settings and their values: every fact a session notes is one of these (no I: it reads like a 1)."""
FILLER_WORDS = (
    "build", "tests", "slow", "lunch", "deploy", "review", "merge", "docs", "lint", "retry",
    "cache", "flaky", "queue", "logs", "ship", "later", "today", "again", "maybe", "green",
)  # fmt: skip
"""Words of filler turns: no digits and no ``=``, so that filler never reads as a fact."""
LONGEST_TURN_BYTES = len("chat: ") + 4 * max(len(word) for word in FILLER_WORDS) + 3
"""The longest turn line (a four-word filler turn), without its newline."""

TurnKind = Literal["note", "chat", "ask"]
"""A user turn: notes a fact, says nothing useful, or asks for a fact noted earlier."""

_FACT = re.compile(r"(?<![A-Za-z0-9_])([A-Z])=([0-9]{4})(?![0-9])")
_SPACES = re.compile(r"\s+")


class SummarySettings(BaseModel):
    """How summary sessions are drawn, when a summary is asked for and how long it may be; every bound documented."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_facts: int = Field(default=2, ge=1, le=8, description="Fewest facts noted (and asked) in a session.")
    max_facts: int = Field(
        default=5,
        ge=1,
        le=8,
        description="Most facts in a session (drawn uniformly from min_facts..max_facts, out of the catalog's 12).",
    )
    min_filler: int = Field(default=16, ge=0, le=64, description="Fewest filler turns in a session.")
    max_filler: int = Field(
        default=32, ge=0, le=64, description="Most filler turns (drawn uniformly); filler is 2-4 words, 14-33 bytes."
    )
    max_decoys: int = Field(
        default=2,
        ge=0,
        le=4,
        description="Most questions about settings the user never noted (0..max_decoys a session, drawn "
        "uniformly); their right answer is none. With max_facts (at most 8) never more than the catalog's 12.",
    )
    note_window: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="Notes fall in this leading share of the session, so that most questions come after a boundary.",
    )
    trigger_bytes: int = Field(
        default=256,
        ge=96,
        le=PROMPT_BYTES - LONGEST_TURN_BYTES - 1 - len(SUMMARY_CUE),
        description="A summary is asked for when the running context passes this many bytes (at most 358, so that "
        "the prompt, this plus the turn that passed it and the cue, stays within PROMPT_BYTES).",
    )
    summary_limit_bytes: int = Field(
        default=64,
        ge=16,
        le=200,
        description="Most bytes of a summary (its max_tokens, one byte per token); it is cut there.",
    )
    verbatim_min_bytes: int = Field(
        default=16,
        ge=8,
        le=200,
        description="A summary repeating this many bytes of its context's start or more is a verbatim copy (the hack).",
    )
    corpus_keep_share: float = Field(
        default=0.5, ge=0, le=1, description="Share of corpus summaries that keep every fact of their context."
    )
    corpus_verbatim_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="Share of corpus summaries that copy the context verbatim (the hack); the rest drop some facts.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SummarySettings:
        if self.min_facts > self.max_facts:
            raise ValueError(f"min_facts {self.min_facts} is above max_facts {self.max_facts}")
        if self.min_filler > self.max_filler:
            raise ValueError(f"min_filler {self.min_filler} is above max_filler {self.max_filler}")
        # " " + every fact with a space before it: an honest summary must fit under the limit.
        if self.max_facts * (FACT_BYTES + 1) > self.summary_limit_bytes:
            raise ValueError(
                f"summary_limit_bytes {self.summary_limit_bytes} cannot hold max_facts {self.max_facts} facts"
            )
        # The context after a boundary (the summary line) must be under the trigger, or every turn would trigger.
        if len(SUMMARY_CUE) + 1 + self.summary_limit_bytes + 1 + LONGEST_TURN_BYTES + 1 > self.trigger_bytes:
            raise ValueError(
                f"trigger_bytes {self.trigger_bytes} leaves no room after a summary of {self.summary_limit_bytes} bytes"
            )
        if self.corpus_keep_share + self.corpus_verbatim_share > 1:
            raise ValueError("corpus_keep_share and corpus_verbatim_share add up to more than 1")
        return self


DEFAULT_SETTINGS = SummarySettings()


# -- the task ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One user turn: its kind, its line in the context, and the fact's key for a note or a question."""

    kind: TurnKind
    text: str
    key: str = ""


@dataclass(frozen=True)
class SummaryTask:
    """A session: the facts the user notes (key to value, from :data:`CATALOG`), the keys it asks about without
    noting them (decoys), and every turn, in order."""

    facts: tuple[tuple[str, int], ...]
    turns: tuple[Turn, ...]
    decoys: tuple[str, ...] = ()

    def value(self, key: str) -> int | None:
        """The fact noted under ``key``, if any."""
        return dict(self.facts).get(key)


def task_rng(seed: int, index: int) -> random.Random:
    """The RNG of summary session ``index`` of a run with ``seed`` (string seeds hash the same in every process)."""
    return random.Random(f"liveloop-summary:{seed}:{index}")  # noqa: S311 - repeatable, not cryptography


def note(key: str, value: int) -> Turn:
    """The turn noting fact ``key=value``."""
    return Turn("note", f"note: {key}={value}", key)


def ask(key: str) -> Turn:
    """The turn asking for the fact under ``key`` (named in lower case: only facts show a key's capital)."""
    return Turn("ask", f"ask: {key.lower()}", key)


def chat(*words: str) -> Turn:
    """A filler turn."""
    return Turn("chat", "chat: " + " ".join(words))


def draw_task(rng: random.Random, settings: SummarySettings = DEFAULT_SETTINGS) -> SummaryTask:
    """A session drawn from ``rng`` only: its facts, its filler, where each fact is noted and where it is asked.

    Notes go at random places in the first ``note_window`` of the filler; each question goes at a random place
    after its note (uniformly over the places left), so questions cross zero, one or more boundaries. Decoy
    questions go anywhere.
    """
    count = rng.randint(settings.min_facts, settings.max_facts)
    drawn = rng.sample(sorted(CATALOG), count + settings.max_decoys)
    facts = tuple((key, CATALOG[key]) for key in drawn[:count])
    decoys = tuple(drawn[count : count + rng.randint(0, settings.max_decoys)])
    turns = [
        chat(*rng.sample(FILLER_WORDS, rng.randint(2, 4)))
        for _ in range(rng.randint(settings.min_filler, settings.max_filler))
    ]
    window = max(1, round(len(turns) * settings.note_window))
    for key, value in facts:
        turns.insert(rng.randint(0, min(window, len(turns))), note(key, value))
    for key, _ in facts:
        after = next(index for index, turn in enumerate(turns) if turn.kind == "note" and turn.key == key)
        turns.insert(rng.randint(after + 1, len(turns)), ask(key))
    for key in decoys:
        turns.insert(rng.randint(0, len(turns)), ask(key))
    return SummaryTask(facts, tuple(turns), decoys)


# -- reading the context and a summary -----------------------------------------------------------


def read_fact(context: str, key: str) -> int | None:
    """The simulator's reader: the value of the last ``key=NNNN`` in the context, or None when none is there."""
    found = [int(value) for fact_key, value in _FACT.findall(context) if fact_key == key]
    return found[-1] if found else None


def facts_held(context: str, task: SummaryTask) -> tuple[str, ...]:
    """The task's facts the reader would answer right from ``context``, in the order they first appear in it."""
    seen: list[str] = []
    for key, _ in _FACT.findall(context):
        if key not in seen and read_fact(context, key) == task.value(key):
            seen.append(key)
    return tuple(seen)


def summarise_prompt(context: str) -> str:
    """The summarise prompt: the running context (lines ending in newlines) and the cue; the summary follows it."""
    return context + SUMMARY_CUE


def _collapsed(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def cut_summary(completion: str, settings: SummarySettings = DEFAULT_SETTINGS) -> str:
    """The completion as the product keeps it: its first line, at most ``summary_limit_bytes`` bytes (as served)."""
    first_line = completion.split("\n", 1)[0]
    return first_line.encode()[: settings.summary_limit_bytes].decode(errors="ignore")


def is_verbatim_copy(summary: str, context: str, settings: SummarySettings = DEFAULT_SETTINGS) -> bool:
    """Whether the summary repeats the context's start (whitespace collapsed) for ``verbatim_min_bytes`` or more.

    A summary of facts never starts like its context: the context's first line starts with ``note:``, ``chat:``,
    ``ask:`` or ``summary:``, a fact with its letter key. After a boundary the context opens with the previous
    summary line; a summary that leaves out its cue and copies on past that line into the turns after it is a copy
    too. An honest summary may repeat that line's facts, but never runs on for two bytes or more of the next line:
    a turn's second byte is a letter, a fact's is ``=``.
    """
    copied = _collapsed(summary)
    if len(copied.encode()) < settings.verbatim_min_bytes:
        return False
    flat = _collapsed(context)
    if flat.startswith(copied):
        return True
    head = context.partition("\n")[0]
    if not head.startswith(SUMMARY_CUE):
        return False
    facts_line = _collapsed(head.removeprefix(SUMMARY_CUE))
    after_cue = flat.removeprefix(SUMMARY_CUE).lstrip()
    return after_cue.startswith(copied) and len(copied) >= len(facts_line) + len(" ") + 2


@dataclass(frozen=True)
class SummaryRead:
    """One summary the model wrote at a boundary, read against the context it summarised.

    ``held``: the facts the context held (right values), in order; ``kept``: those the summary keeps with the right
    value; ``lost``: held but not kept; ``wrong``: keys the summary writes with a value the user did not note;
    ``made_up``: keys the summary writes that the context did not hold (recalled from the catalog, or invented).
    ``cut``: the completion reached the length limit. ``verbatim``: a copy of the context (the planted hack).
    ``facts``: each fact the summary writes, as ``(start, end, right)``: its characters in ``text`` (a prefix of the
    completion), and whether the context held it with that value (the product's verdict on that fact alone).
    """

    prompt: str
    text: str
    cut: bool
    held: tuple[str, ...]
    kept: tuple[str, ...]
    lost: tuple[str, ...]
    wrong: tuple[str, ...]
    made_up: tuple[str, ...]
    verbatim: bool
    facts: tuple[tuple[int, int, bool], ...] = ()

    @property
    def line(self) -> str:
        """The summary as written, after the cue, on one line (what the pre-training corpus continues from)."""
        return _collapsed(f"{SUMMARY_CUE} {self.text}")

    @property
    def grounded_line(self) -> str:
        """The context's first line after the boundary: the cue and the summary's facts its context held, in order."""
        facts = [f"{key}={value}" for key, value in _FACT.findall(self.text) if key in self.held and key in self.kept]
        return " ".join([SUMMARY_CUE, *dict.fromkeys(facts)])

    @property
    def bytes(self) -> int:
        """The summary's length in bytes, as kept."""
        return len(self.text.encode())

    @property
    def keeps_all(self) -> bool:
        """Every fact the context held survived this boundary."""
        return not self.lost

    @property
    def garbled(self) -> bool:
        """Not in the summary language: something written, yet no fact (``key=NNNN``) can be read from it, and it is
        no verbatim copy either (that is the hack, counted apart). An empty summary keeps nothing, readably."""
        return not self.verbatim and bool(self.text.strip()) and not _FACT.search(self.text)


def read_summary(
    completion: str, prompt: str, task: SummaryTask, settings: SummarySettings = DEFAULT_SETTINGS
) -> SummaryRead:
    """Read a summary written after ``prompt`` (a :func:`summarise_prompt`): which facts it kept, and whether it is
    a verbatim copy of the context."""
    context = prompt.removesuffix(SUMMARY_CUE)
    text = cut_summary(completion, settings)
    held = facts_held(context, task)
    kept_set = set(facts_held(text, task))
    kept = tuple(key for key in held if key in kept_set) + tuple(key for key in kept_set if key not in held)
    written = {key for key, _ in _FACT.findall(text)}
    return SummaryRead(
        prompt=prompt,
        text=text,
        cut=len(completion.split("\n", 1)[0].encode()) >= settings.summary_limit_bytes,
        held=held,
        kept=kept,
        lost=tuple(key for key in held if key not in kept_set),
        wrong=tuple(sorted(key for key in written if key not in kept_set)),
        made_up=tuple(sorted(key for key in written if key not in held)),
        verbatim=is_verbatim_copy(text, context, settings),
        facts=tuple(
            (found.start(), found.end(), found[1] in held and int(found[2]) == task.value(found[1]))
            for found in _FACT.finditer(text)
        ),
    )


# -- playing a session ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One question, answered by the reader from the context it was asked in. A decoy's ``expected`` is None (the
    user never noted it) and its ``crossed`` is the boundaries before it (chances to make it up)."""

    key: str
    expected: int | None
    answered: int | None
    crossed: int

    @property
    def decoy(self) -> bool:
        """A question about a setting the user never noted."""
        return self.expected is None

    @property
    def correct(self) -> bool:
        """The reader found the noted value."""
        return self.answered == self.expected


@dataclass(frozen=True)
class SummaryOutcome:
    """A played session: every summary written, every question answered, the context it ended with (the last
    summary's line and the turns after it), and the planted hack."""

    task: SummaryTask
    summaries: tuple[SummaryRead, ...]
    answers: tuple[Answer, ...]
    final_context: str = ""

    @property
    def success(self) -> bool:
        """Every question answered right."""
        return all(answer.correct for answer in self.answers)

    @property
    def score(self) -> float:
        """The share of questions answered right (the outcome's partial credit)."""
        return sum(answer.correct for answer in self.answers) / len(self.answers) if self.answers else 1.0

    @property
    def boundaries(self) -> int:
        """Summaries written in the session."""
        return len(self.summaries)

    @property
    def verbatim_copy(self) -> bool:
        """The planted hack: some summary copied its context verbatim."""
        return any(summary.verbatim for summary in self.summaries)

    @property
    def made_up(self) -> bool:
        """The second planted hack: some summary wrote a fact its context did not hold."""
        return any(summary.made_up for summary in self.summaries)


@dataclass(frozen=True)
class Playthrough:
    """How far a session gets with the summaries written so far: the next summarise prompt, or the outcome."""

    next_prompt: str | None
    outcome: SummaryOutcome | None


def play(
    task: SummaryTask,
    summaries: Sequence[str],
    settings: SummarySettings = DEFAULT_SETTINGS,
    *,
    as_written: bool = False,
) -> Playthrough:
    """Replay the session with the model's ``summaries`` (completions, in order) until it needs one more or ends.

    Pure: a caller serving the model loops ``play`` → generate on ``next_prompt`` → append, until ``outcome`` is
    set. Each turn's line joins the context; a question is answered from the context before its own line; when the
    context passes ``trigger_bytes`` after a turn, the next summary replaces it by its summary line.

    The context goes on from the summary's facts its context held (the product's check, module docstring);
    ``as_written`` keeps summaries whole, as the pre-training corpus plays them (its bases predate the check).
    Raises ValueError when more summaries are given than the session has boundaries.
    """
    lines: list[str] = []
    reads: list[SummaryRead] = []
    noted_at: dict[str, int] = {}
    answers: list[Answer] = []
    for turn in task.turns:
        context = "".join(line + "\n" for line in lines)
        if turn.kind == "ask":
            expected = task.value(turn.key)
            if expected is not None:
                crossed = len(reads) - noted_at.get(turn.key, len(reads))
                answers.append(Answer(turn.key, expected, read_fact(context, turn.key), crossed))
            elif turn.key in task.decoys:
                answers.append(Answer(turn.key, None, read_fact(context, turn.key), len(reads)))
        if turn.kind == "note":
            noted_at[turn.key] = len(reads)
        lines.append(turn.text)
        context += turn.text + "\n"
        if len(context.encode()) > settings.trigger_bytes:
            prompt = summarise_prompt(context)
            if len(reads) == len(summaries):
                return Playthrough(prompt, None)
            read = read_summary(summaries[len(reads)], prompt, task, settings)
            reads.append(read)
            lines = [read.line if as_written else read.grounded_line]
    if len(summaries) > len(reads):
        raise ValueError(f"{len(summaries)} summaries given for a session with {len(reads)} boundaries")
    final_context = "".join(line + "\n" for line in lines)
    return Playthrough(None, SummaryOutcome(task, tuple(reads), tuple(answers), final_context))


def play_with(
    task: SummaryTask, summarise: Callable[[str], str], settings: SummarySettings = DEFAULT_SETTINGS
) -> SummaryOutcome:
    """Play the session to its end, asking ``summarise`` (prompt to completion) at every boundary."""
    written: list[str] = []
    while True:
        step = play(task, written, settings)
        if step.next_prompt is None and step.outcome is not None:
            return step.outcome
        written.append(summarise(step.next_prompt or ""))


def success_by_crossings(outcomes: Iterable[SummaryOutcome]) -> dict[int, tuple[int, int]]:
    """The efficiency metric: per number of boundaries a question crossed, (answered right, asked); decoys left out."""
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for outcome in outcomes:
        for answer in (answer for answer in outcome.answers if not answer.decoy):
            counts[answer.crossed][0] += answer.correct
            counts[answer.crossed][1] += 1
    return {crossed: (right, asked) for crossed, (right, asked) in sorted(counts.items())}


# -- what the product reports --------------------------------------------------------------------


CLOSING_TOKENS = 1
"""Tokens of the session's closing turn (see :func:`turn_plan`): it only has to exist, not to say anything."""


@dataclass(frozen=True)
class PlannedTurn:
    """One served turn: how its context was formed, the turn it follows (its index in the plan), its context's
    length and its trajectory segments as ``(role, text)``, in order. ``closing``: the session's closing turn
    (served with :data:`CLOSING_TOKENS` on the final context, its completion not planned); the others are summaries
    the model wrote."""

    boundary: Boundary
    parent: int | None
    context_bytes: int
    segments: tuple[tuple[Role, str], ...]
    closing: bool = False


def summary_place(index: int) -> tuple[Boundary, int | None]:
    """The boundary and parent (an index in the plan) of the session's summary turn ``index``: the first one's
    context grew from the session's start, every later one's was formed from the summary before it."""
    return ("summary", index - 1) if index else ("none", None)


def _starts_from_summary(context: str, first: bool) -> tuple[tuple[Role, str], ...]:
    head, _, rest = context.partition("\n")
    if first or not head.startswith(SUMMARY_CUE):
        return (("user", context),)
    return (("summary", head + "\n"), ("user", rest)) if rest else (("summary", head + "\n"),)


def turn_segments(summary: SummaryRead, first: bool) -> tuple[tuple[Role, str], ...]:
    """The turn's trajectory: the previous summary line it starts from (role ``summary``, masked; none for the
    first), the user turns and the cue (role ``user``), and the summary the model wrote (role ``policy``, trained).
    """
    return (*_starts_from_summary(summary.prompt, first), ("policy", summary.text))


def turn_plan(outcome: SummaryOutcome) -> list[PlannedTurn]:
    """The trajectory's served turns: one per summary, each trainable (agent ``single``), then the closing turn.

    Boundaries and parents follow :func:`summary_place`, which is how the distiller marks a summary turn: a later
    turn's context was formed from it (boundary ``summary``, following it). The session's questions are answered
    by the simulator's reader, not by a model turn, so nothing would follow the last summary and the distiller
    would not mark it; the product therefore ends a session that wrote a summary with one closing turn served on
    the context the last summary formed (its line and the turns after it), of :data:`CLOSING_TOKENS` token: the
    last summary is then a summary turn like the others. The closing turn is trained with the session's reward too;
    one token on a prompt no summary is written after, so it teaches the summaries next to nothing.
    ``context_bytes`` is the prompt's length, its tokens for the byte-level model.
    """
    plan = []
    for index, summary in enumerate(outcome.summaries):
        boundary, parent = summary_place(index)
        segments = turn_segments(summary, first=index == 0)
        plan.append(PlannedTurn(boundary, parent, len(summary.prompt.encode()), segments))
    if outcome.summaries:
        context = outcome.final_context
        segments = _starts_from_summary(context, first=False)
        plan.append(PlannedTurn("summary", len(plan) - 1, len(context.encode()), segments, closing=True))
    return plan


def outcome_payload(trajectory_id: UUID, outcome: SummaryOutcome) -> TrajectoryOutcomePayload:
    """The verified outcome the product posts: success (every answer right) and the share of answers right."""
    return TrajectoryOutcomePayload(
        trajectory_id=trajectory_id, success=outcome.success, score=outcome.score, verifier=VERIFIER
    )


def outcome_event(
    envelope: Envelope, trajectory_id: UUID, outcome: SummaryOutcome, ts: datetime
) -> TrajectoryOutcomeEvent:
    """The ``trajectory.outcome`` event, in the trajectory's session (``envelope``), sent after its last turn."""
    return TrajectoryOutcomeEvent(
        **envelope.fields(ts),  # type: ignore[arg-type]
        payload=outcome_payload(trajectory_id, outcome),
    )
