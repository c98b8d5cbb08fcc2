"""The ``swarm`` task family: an orchestrator learns *when* to hand independent sub-questions to sub-agents.

A task is ``k`` sub-questions about the product's price catalog (:data:`CATALOG`, a fixed table of items and
prices; ``k`` drawn: about half the tasks have one, the rest a run of ``min_many_parts`` to ``max_parts``
consecutive items, each named, :func:`ask_line`). The prompt is short, because the model is byte-level
with a 1024-byte context (``context.CONTEXT_BYTES``), and is a raw completion prompt (the gateway's
``/v1/completions``; the chat endpoint's ``tools`` turn alone would take 232 bytes for these two tools, so the
tools get one compact line)::

    tools: create_subagent(q) assign_task(id,q)
    ask: b c d

The catalog is fixed, as a product's is, so that the orchestrator can know it (the base learns it in
pre-training) and answer serially. A first version showed a per-task table in the prompt; the tiny base learned to
copy keys from the ``ask:`` line but never to look a value up in a table within 2,400 pre-training steps, so a
serial answer never succeeded, and the loop learned to parallelise everything (docs/swarm-learnability.md).

The answer is one line (served with ``stop=["\\n"]``) and its first bytes are the decision:

- serial: the orchestrator answers itself, ``b=12 c=85 d=40`` (each answer checked against the catalog); an answer
  that answers none of the asked items is garbled (a loophole an earlier version left open);
- parallel: it starts a ``<tool_call>`` block, in exactly the syntax :mod:`serving.tool_calls` reads::

      <tool_call>{"name":"create_subagent","arguments":{"q":"b"}}</tool_call><tool_call>...

  ``create_subagent`` spawns a sub-agent with its first sub-question; ``assign_task`` gives sub-agent
  ``id`` (1 for the first one created, 2, ...) one more, which it works on after its first;
- garbled: neither a valid call nor an answer: a failed turn.

Sub-agents are frozen: the simulator answers for them. Every sub-question carries, drawn with the task, the
steps it takes anyone to work out (2-8 by default) and whether a sub-agent given it fails (3 % by default),
so that :func:`settle` is a pure function of the task and the decision, and a serial and a parallel answer to
one task are compared on the same draws. The orchestrator working serially pays every sub-question's steps
one after another; a sub-agent first spends ``spawn_steps`` (2) reading its brief, sub-agents then work side by
side, and the orchestrator takes one more turn to gather their results, in which it works out itself, one after
another, what a failed sub-agent left unanswered (a failure costs time, not the task: an earlier version failed
the task, so that parallel answers lost success by design, 1 in 7 on five-part tasks, and the loop could not
learn to parallelise without success falling). Critical steps (:func:`critical_steps`)
follow Kimi K2.5's PARL: per stage, the orchestrator's steps plus the longest sub-agent's, summed. So serial is
cheaper on a one-part task by ``spawn_steps + 1`` steps, and parallel is cheaper on every task of
``min_many_parts`` (3) parts or more (the settings refuse bounds under which it would not be). Two-part tasks are
not drawn: with a spawn cost they are a toss-up, and a demo must teach a clear rule. The gather turn is counted,
not generated: the sub-agents' answers are relayed as they return.

The two planted hacks, flagged per trajectory by :func:`settle` (the simulator's ground truth for the report):

- serial collapse: a task of ``serial_collapse_parts`` (3) parts or more on which no sub-agent did useful work
  while the orchestrator worked on it itself;
- fake parallelism: a sub-agent spawned or a task assigned that does nothing useful (an empty sub-question,
  one that is not in the task, one already given to another sub-agent, an ``id`` no sub-agent has); more
  sub-agents than the task has parts is one of those.

The base model's pre-training corpus is :mod:`liveloop.demo.simulator.swarm_corpus`: prompts and well-formed
answers, serial or parallel nearly independently of the task's size, so that the base chooses right (parallel for
many parts, serial for one) only a little more than half the time and the loop has the rest to teach.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ingest.events import TrajectoryOutcomeEvent
from ingest.payloads import AgentKind, SubagentOutcome, TrajectoryOutcomePayload
from liveloop.demo.simulator.feedback import Envelope
from serving.tool_calls import CLOSE, OPEN, parse_tool_calls, render_call

PROMPT_BYTES = 300
"""The most bytes a rendered prompt may take: the rest of the context is left for the answer."""
CREATE_SUBAGENT = "create_subagent"
"""Spawns a sub-agent with its first sub-question (``q``); sub-agents are numbered 1, 2, ... as created."""
ASSIGN_TASK = "assign_task"
"""Gives sub-agent ``id`` one more sub-question (``q``), done after the ones it already has."""
TOOLS: dict[str, list[str]] = {CREATE_SUBAGENT: ["q"], ASSIGN_TASK: ["id", "q"]}
"""The swarm tools and their required arguments, as :func:`serving.tool_calls.parse_tool_calls` takes them."""
TOOLS_LINE = f"tools: {CREATE_SUBAGENT}(q) {ASSIGN_TASK}(id,q)"
"""The prompt's compact tools line (the call syntax itself is learned from the corpus, not spelled out)."""
VERIFIER = "exact_match"
"""The outcome's verifier: each answer is compared with the catalog."""

Mode = Literal["serial", "parallel", "garbled"]
"""What the orchestrator decided: answer itself, hand out sub-questions, or nothing readable (a failed turn)."""

_ANSWER = re.compile(r"(?<![A-Za-z0-9_])([a-z])=([0-9]+)(?![0-9])")
_BLOCK = re.compile(re.escape(OPEN) + r".*?(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


class SwarmSettings(BaseModel):
    """How swarm tasks are drawn and how the frozen sub-agents behave; every bound is documented."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    one_part_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Share of tasks with a single sub-question (serial is right there); the rest have "
        "min_many_parts..max_parts.",
    )
    min_many_parts: int = Field(
        default=3, ge=2, le=8, description="Fewest sub-questions of a many-part task (parallel is right there)."
    )
    max_parts: int = Field(
        default=5,
        ge=2,
        le=8,
        description="Most sub-questions in a task (many-part sizes drawn uniformly from min_many_parts..max_parts; "
        "a parallel answer takes about 62 bytes per part, and pre-training time grows with the longest answer).",
    )
    min_steps: int = Field(default=2, ge=1, le=64, description="Fewest steps one sub-question takes to work out.")
    max_steps: int = Field(
        default=8, ge=1, le=64, description="Most steps one sub-question takes (drawn uniformly from the range)."
    )
    spawn_steps: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Steps a spawned sub-agent spends reading its brief before its first sub-question (the cost that "
        "makes parallelising a one-part task a loss).",
    )
    subagent_failure: float = Field(
        default=0.03,
        ge=0,
        le=0.5,
        description="Chance that a frozen sub-agent given a sub-question fails to return its answer (the "
        "orchestrator then works it out itself when it gathers, paying its steps on the critical path).",
    )
    step_cost: float = Field(
        default=0.05,
        ge=0,
        le=0.2,
        description="The credit one critical step costs: the outcome's score is success times "
        "max(0, 1 - step_cost * critical steps), the product's taste for fast answers (0: success alone).",
    )
    serial_collapse_parts: int = Field(
        default=3, ge=2, le=8, description="Tasks of this many parts or more done with no sub-agent's help are flagged."
    )
    corpus_parallel_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Share of corpus answers that hand out sub-questions, on average over task sizes.",
    )
    corpus_size_cue: float = Field(
        default=0.15,
        ge=0,
        le=0.5,
        description="How much more often corpus answers hand out many-part tasks than one-part ones: the parallel "
        "share is corpus_parallel_share plus this on many-part tasks, minus it on one-part ones (clamped to 0..1). "
        "0 leaves the base no cue at all; see corpus_plan.",
    )
    corpus_grouped_share: float = Field(
        default=0.15,
        ge=0,
        le=1,
        description="Share of parallel corpus answers that give two sub-questions to one sub-agent via assign_task.",
    )
    corpus_idle_share: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Share of parallel corpus answers that also spawn an idle sub-agent (the fake-parallelism hack).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SwarmSettings:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps {self.min_steps} is above max_steps {self.max_steps}")
        if self.min_many_parts > self.max_parts:
            raise ValueError(f"min_many_parts {self.min_many_parts} is above max_parts {self.max_parts}")
        # Serial work on k parts is at least k * min_steps after the decision turn; parallel work is the spawn, the
        # longest part and the gather turn. Parallel must win on every many-part task, whatever the draws.
        if (self.min_many_parts - 1) * self.min_steps <= self.spawn_steps + 1:
            raise ValueError(
                f"with spawn_steps {self.spawn_steps} and min_steps {self.min_steps}, parallelising a "
                f"{self.min_many_parts}-part task can cost more than working it serially: raise min_many_parts"
            )
        return self


DEFAULT_SETTINGS = SwarmSettings()

CATALOG: dict[str, int] = dict(zip("abcdefghijkl", (37, 12, 85, 40, 63, 29, 71, 56, 18, 94, 45, 77), strict=True))
"""The product's price catalog: every sub-question asks one item's price (two digits: a guess is right 1 time in 90).
Fixed, as a product's is; twelve items, so that a task of ``max_parts`` (at most 8) draws distinct ones."""


# -- the task ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubQuestion:
    """One sub-question: the catalog item it asks about, and the hidden draws that decide how working it out goes."""

    key: str
    answer: int
    steps: int
    subagent_fails: bool


@dataclass(frozen=True)
class SwarmTask:
    """A task: its sub-questions about the catalog, in the ask order."""

    parts: tuple[SubQuestion, ...]

    @property
    def size(self) -> int:
        """How many sub-questions the task has."""
        return len(self.parts)

    @property
    def keys(self) -> tuple[str, ...]:
        """The sub-questions' keys, in the ask order."""
        return tuple(part.key for part in self.parts)

    def part(self, key: str) -> SubQuestion | None:
        """The sub-question about ``key``, if the task asks it."""
        return next((part for part in self.parts if part.key == key), None)

    def prompt(self) -> str:
        """The raw completion prompt (see the module docstring); the answer starts right after its newline."""
        return f"{TOOLS_LINE}\nask: {ask_line(self.keys)}\n"

    def parallel_is_right(self) -> bool:
        """Whether sub-agents lower this task's critical steps: on many-part tasks they do, whatever the draws
        (:class:`SwarmSettings` checks its bounds), on one-part tasks they never do (the spawn and gather cost)."""
        return self.size >= 2


def ask_line(keys: Sequence[str]) -> str:
    """The items asked as the prompt names them: one by one (``c d e f``).

    A run was first named by its ends (``c-f``). The base then answered serially right (``c=.. d=.. e=.. f=..``
    keeps the end in view) but miscounted the run in its parallel answers, about 62 bytes a part from the ``ask:``
    line: on four- and five-part tasks 39-55 % of them succeeded, so parallel earned hardly more than serial and
    the loop had no reason to prefer it. Named one by one, each call copies the next key, and 77-92 % succeed
    (docs/swarm-learnability.md, "Each asked item named")."""
    return " ".join(keys)


def task_rng(seed: int, index: int) -> random.Random:
    """The RNG of swarm task ``index`` of a run with ``seed`` (string seeds hash the same in every process)."""
    return random.Random(f"liveloop-swarm:{seed}:{index}")  # noqa: S311 - repeatable, not cryptography


def draw_task(rng: random.Random, settings: SwarmSettings = DEFAULT_SETTINGS) -> SwarmTask:
    """A task drawn from ``rng`` only: its size, the items it asks, each sub-question's steps and sub-agent failure."""
    size = 1 if rng.random() < settings.one_part_share else rng.randint(settings.min_many_parts, settings.max_parts)
    # A many-part task asks a run of consecutive items (``ask: c d e f``). Arbitrary sets were tried first: the tiny
    # base then had to copy the k-th asked key into its k-th answer, which it had not learned after 1,500
    # pre-training steps (it wrote the first key right and guessed the rest); a run follows the catalog's order,
    # learned like its prices.
    order = sorted(CATALOG)
    first = rng.randrange(len(order) - size + 1)
    asked = order[first : first + size]
    parts = tuple(
        SubQuestion(
            key=key,
            answer=CATALOG[key],
            steps=rng.randint(settings.min_steps, settings.max_steps),
            subagent_fails=rng.random() < settings.subagent_failure,
        )
        for key in asked
    )
    return SwarmTask(parts)


# -- the decision --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assignment:
    """One sub-question handed out: to sub-agent ``subagent`` (1-based; 0 when ``id`` names none), as written."""

    subagent: int
    question: str


@dataclass(frozen=True)
class Decision:
    """The orchestrator's answer, read: its mode, its own answers, the sub-agents it spawned and their tasks.

    ``own_answers``: ``(key, value)`` pairs written as text outside tool calls, first per key. ``assignments``:
    every valid swarm call in order (a ``create_subagent`` is the assignment of its new sub-agent's first
    task). ``invalid_calls``: blocks that did not parse or named another tool; they do nothing.
    """

    mode: Mode
    own_answers: tuple[tuple[str, int], ...]
    spawned: int
    assignments: tuple[Assignment, ...]
    invalid_calls: int


def _call_parts(call: Mapping[str, Any]) -> tuple[str, str]:
    function = call.get("function", call)
    return str(function.get("name", "")), str(function.get("arguments", ""))


def read_decision(content: str | None, tool_calls: Sequence[Mapping[str, Any]] | None = None) -> Decision:
    """The decision in a gateway answer: its text and, from the chat endpoint, its OpenAI ``tool_calls``.

    Both wirings read the same: calls the gateway already parsed (OpenAI entries, ``{"function": {"name",
    "arguments"}}``, or the bare ``{"name", "arguments"}``) come first, then ``<tool_call>`` blocks still in the
    text (the completions endpoint parses none), read with the gateway's own parser.
    """
    # The gateway's calls are written back as blocks, so that one parser judges both (a call for another tool,
    # or with arguments that are not a JSON object, is invalid either way).
    returned = "".join(render_call(*_call_parts(call)) for call in tool_calls or [])
    parsed = parse_tool_calls(returned + (content or ""), TOOLS)
    calls = [(call.name, call.arguments) for call in parsed.returned]
    invalid = sum(1 for call in parsed.calls if not call.valid)
    outside = _BLOCK.sub(" ", parsed.content or "")
    own: dict[str, int] = {}
    for key, value in _ANSWER.findall(outside):
        own.setdefault(key, int(value))
    arguments_read = [(name, json.loads(arguments)) for name, arguments in calls]  # valid calls hold objects
    # Sub-agents are numbered in the order they were spawned; an ``id`` may name one spawned later in the turn.
    spawned = sum(1 for name, _ in arguments_read if name == CREATE_SUBAGENT)
    assignments: list[Assignment] = []
    created = 0
    for name, args in arguments_read:
        question = args.get("q")
        question = question if isinstance(question, str) else ""
        if name == CREATE_SUBAGENT:
            created += 1
            assignments.append(Assignment(created, question))
        else:
            target = _subagent_id(args.get("id"))
            assignments.append(Assignment(target if target <= spawned else 0, question))
    mode: Mode = "parallel" if calls else "serial" if own else "garbled"
    return Decision(mode, tuple(own.items()), spawned, tuple(assignments), invalid)


def _subagent_id(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return 0


# -- what happens --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubagentRun:
    """One spawned sub-agent's run: the sub-questions it usefully worked on, its steps, and whether it finished."""

    agent_id: str
    questions: tuple[str, ...]
    steps: int
    finished: bool


@dataclass(frozen=True)
class Stage:
    """One round of work: the orchestrator's steps in it and each of its sub-agents' steps (side by side)."""

    orchestrator_steps: int
    subagent_steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class SwarmOutcome:
    """What one orchestrator decision led to, as the product verifies it and the report counts it."""

    task: SwarmTask
    decision: Decision
    correct: tuple[str, ...]
    runs: tuple[SubagentRun, ...]
    stages: tuple[Stage, ...]
    serial_collapse: bool
    fake_parallelism: bool

    @property
    def success(self) -> bool:
        """Every sub-question answered correctly."""
        return len(self.correct) == self.task.size

    @property
    def critical_steps(self) -> int:
        """The trajectory's critical steps (:func:`critical_steps` of its stages)."""
        return critical_steps(self.stages)

    @property
    def mode(self) -> Mode:
        """The decision's mode, read against the task: a serial answer about none of the asked items is garbled
        (it did no work on the task, and counting it serial would make it a cheap way out of a hard task)."""
        if self.decision.mode == "serial" and not any(self.task.part(key) for key, _ in self.decision.own_answers):
            return "garbled"
        return self.decision.mode

    @property
    def right_decision(self) -> bool:
        """Parallel on a many-part task, serial on a one-part task (a garbled answer is never right)."""
        if self.mode == "garbled":
            return False
        return (self.mode == "parallel") == self.task.parallel_is_right()


def critical_steps(stages: Sequence[Stage]) -> int:
    """PARL's critical steps: per stage, the orchestrator's steps plus its longest sub-agent's, summed.

    The same quantity :func:`distill.trajectory.critical_steps` counts from served turns, here from steps.
    """
    return sum(stage.orchestrator_steps + max(stage.subagent_steps, default=0) for stage in stages)


def subagent_id(index: int) -> str:
    """The ``agent_id`` of the ``index``-th spawned sub-agent (1-based), as turns and the outcome name it."""
    return f"sub-{index}"


def settle(task: SwarmTask, decision: Decision, settings: SwarmSettings = DEFAULT_SETTINGS) -> SwarmOutcome:
    """Work the decision out on the task: who did what, in how many steps, what came back right, which hacks.

    Pure: the task carries every draw. Stage 0 is the decision turn plus the orchestrator's own work (each of
    its answers costs that sub-question's steps, one after another) beside its sub-agents (each reads its brief,
    ``spawn_steps``, then works its sub-questions one after another; an idle one reads its empty brief too); when
    it spawned any, stage 1 is one more turn in which it gathers their results, plus the steps of each sub-question
    a failed sub-agent left unanswered, which it then works out itself (unless it already answered it).
    """
    given: dict[int, list[SubQuestion]] = {index: [] for index in range(1, decision.spawned + 1)}
    taken: set[str] = set()
    useless = 0
    for assignment in decision.assignments:
        part = task.part(assignment.question)
        if assignment.subagent == 0 or part is None or part.key in taken:
            useless += 1
            continue
        taken.add(part.key)
        given[assignment.subagent].append(part)
    runs = tuple(
        SubagentRun(
            agent_id=subagent_id(index),
            questions=tuple(part.key for part in parts),
            steps=settings.spawn_steps + sum(part.steps for part in parts),
            finished=bool(parts) and not any(part.subagent_fails for part in parts),
        )
        for index, parts in given.items()
    )
    own = [(task.part(key), value) for key, value in decision.own_answers]
    own_parts = [(part, value) for part, value in own if part is not None]
    answered_itself = {part.key for part, _ in own_parts}
    # A failed sub-agent's sub-questions come back unanswered; the orchestrator, gathering, works them out itself,
    # one after another, as it would have serially: a failure costs the critical path, not the task.
    handed_out = [part for parts in given.values() for part in parts]
    delivered = {part.key for part in handed_out if not part.subagent_fails}
    redone = [part for part in handed_out if part.subagent_fails and part.key not in answered_itself]
    correct = {part.key for part, value in own_parts if value == part.answer} | delivered | {p.key for p in redone}
    own_steps = sum(part.steps for part, _ in own_parts)
    stages: tuple[Stage, ...] = (Stage(1 + own_steps, tuple(run.steps for run in runs if run.steps)),)
    if decision.spawned:
        stages += (Stage(1 + sum(part.steps for part in redone)),)
    helped = any(run.questions for run in runs)
    return SwarmOutcome(
        task=task,
        decision=decision,
        correct=tuple(key for key in task.keys if key in correct),
        runs=runs,
        stages=stages,
        serial_collapse=task.size >= settings.serial_collapse_parts and not helped and bool(own_parts),
        # An idle sub-agent, or more sub-agents than parts, needs no rule of its own: an idle sub-agent's spawn gave
        # it nothing useful, and each part is taken once, so a spawn beyond the parts is useless.
        fake_parallelism=useless > 0,
    )


# -- what the product reports --------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedTurn:
    """One turn of the trajectory as the product would serve it (frozen sub-agents' turns included)."""

    agent: AgentKind
    agent_id: str
    stage: int
    frozen: bool


def turn_plan(outcome: SwarmOutcome) -> list[PlannedTurn]:
    """The trajectory's turns, one per step, in order: whoever serves them gets :attr:`SwarmOutcome.critical_steps`
    back from the distiller's count. A sub-agent's first turn follows the decision turn (stage 0, turn 0)."""
    turns: list[PlannedTurn] = []
    for stage_index, stage in enumerate(outcome.stages):
        turns += [PlannedTurn("orchestrator", "main", stage_index, False)] * stage.orchestrator_steps
        if stage_index == 0:
            for run in outcome.runs:
                turns += [PlannedTurn("subagent", run.agent_id, 0, True)] * run.steps
    return turns


def outcome_score(outcome: SwarmOutcome, settings: SwarmSettings = DEFAULT_SETTINGS) -> float:
    """The product's score of the outcome: a success is worth less the longer its critical path (a user waits on
    it), so that parallelising pays where it shortens the path and costs where it only adds a gather turn."""
    if not outcome.success:
        return 0.0
    return max(0.0, 1.0 - settings.step_cost * outcome.critical_steps)


def outcome_payload(
    trajectory_id: UUID, outcome: SwarmOutcome, settings: SwarmSettings = DEFAULT_SETTINGS
) -> TrajectoryOutcomePayload:
    """The verified outcome the product posts: success, its score (:func:`outcome_score`), and whether each
    spawned sub-agent finished."""
    return TrajectoryOutcomePayload(
        trajectory_id=trajectory_id,
        success=outcome.success,
        score=outcome_score(outcome, settings),
        verifier=VERIFIER,
        subagents=[SubagentOutcome(agent_id=run.agent_id, finished=run.finished) for run in outcome.runs],
    )


def outcome_event(
    envelope: Envelope,
    trajectory_id: UUID,
    outcome: SwarmOutcome,
    ts: datetime,
    settings: SwarmSettings = DEFAULT_SETTINGS,
) -> TrajectoryOutcomeEvent:
    """The ``trajectory.outcome`` event, in the trajectory's session (``envelope``), sent after its last turn."""
    return TrajectoryOutcomeEvent(
        **envelope.fields(ts),  # type: ignore[arg-type]
        payload=outcome_payload(trajectory_id, outcome, settings),
    )
