"""One ``swarm`` session as a product's agent framework runs it, through the code simulator's public surfaces:
the gateway (``/v1/completions``, the official ``openai`` client) and the SDK.

1. ``session.started`` (surface ``agent``);
2. the orchestrator's decision: one trainable turn, the first of a new trajectory (``agent=orchestrator``,
   stage 0), on the task's prompt (:meth:`~liveloop.demo.simulator.swarm.SwarmTask.prompt`), one line, labelled
   with the task's kind (:func:`task_kind`);
3. the product reads the decision and works it out (:func:`~liveloop.demo.simulator.swarm.settle`). The frozen
   sub-agents' work is simulated, yet each spawned sub-agent gets one served turn (``agent=subagent``,
   ``frozen=true``, its ``agent_id``, the decision turn as parent, one token): the distiller sees which
   sub-agents ran, and the gateway carries the extra requests a swarm costs;
4. the verified outcome (:func:`~liveloop.demo.simulator.swarm.outcome_event`: success, a score that falls with
   the critical path, which sub-agents finished), then ``session.ended``.

The :class:`SwarmRecord` returned is the product's own view of the trajectory; :class:`SwarmTally` counts them
by the policy version that served the decision, for the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from liveloop.demo.simulator.agent_session import end_session, start_session
from liveloop.demo.simulator.context import CONTEXT_BYTES
from liveloop.demo.simulator.session import EventSink
from liveloop.demo.simulator.stats import mean_figure, rate_figure
from liveloop.demo.simulator.swarm import (
    DEFAULT_SETTINGS,
    Mode,
    SwarmOutcome,
    SwarmSettings,
    draw_task,
    outcome_event,
    outcome_score,
    read_decision,
    settle,
    task_rng,
)
from liveloop.demo.simulator.tally import VersionTally
from liveloop.demo.simulator.transport import GatewayClient


@dataclass(frozen=True)
class SwarmRecord:
    """One trajectory as the product saw it."""

    policy_version: int
    parts: int
    mode: Mode
    success: bool
    score: float
    critical_steps: int
    right_decision: bool
    serial_collapse: bool
    fake_parallelism: bool
    subagent_turns: int


MANY_PARTS = 2
"""Tasks of this many parts or more are "many-part": parallel is right there (one-part tasks stay serial)."""


def swarm_session_id(run_id: str, index: int) -> str:
    """The id of swarm session ``index`` of run ``run_id``."""
    return f"swarm-{run_id}-{index}"


def task_kind(parts: int) -> str:
    """The product's label of a task (``X-Liveloop-Task-Kind``): a single lookup or a batch of several.

    The product knows which it was asked, and labels it as a product labels its request types. The model never
    sees the label; the learner keeps a reward baseline per task kind, and the two kinds' rewards differ by
    nature (a one-part answer earns 0.5-0.7 whichever way it decides, a many-part one 0.1-0.2: the critical path
    is longer): under one baseline every one-part answer got a positive advantage and every many-part one a
    negative one, which drowned the difference between parallel and serial on the same kind of task.
    """
    return "lookup.single" if parts < MANY_PARTS else "lookup.batch"


def run_swarm_session(
    gateway: GatewayClient,
    sink: EventSink,
    index: int,
    *,
    seed: int,
    run_id: str,
    tenant: str = "default",
    temperature: float = 1.0,
    settings: SwarmSettings = DEFAULT_SETTINGS,
) -> SwarmRecord:
    """Run swarm session ``index`` of run ``run_id`` to its end (see the module docstring) and return its record.

    The task and the sampling seeds repeat for ``(seed, index)``; the session id carries ``run_id`` so that two
    runs never share one. Raises what the gateway client raises (``openai.OpenAIError``) if a turn fails.
    """
    rng = task_rng(seed, index)
    task = draw_task(rng, settings)
    session = start_session(sink, swarm_session_id(run_id, index), index, tenant)
    trajectory = str(session.trajectory_id)
    prompt = task.prompt()
    decision = gateway.complete(
        prompt,
        **session.request(),
        max_tokens=CONTEXT_BYTES - len(prompt.encode()),  # byte-level tokens: whatever the context has left
        temperature=temperature,
        seed=rng.randrange(2**31),
        turn={"trajectory_id": trajectory, "agent": "orchestrator", "stage": "0"},
        task_kind=task_kind(task.size),
    )
    outcome = settle(task, read_decision(decision.text), settings)
    for run in outcome.runs:
        gateway.complete(
            f"{run.agent_id}: {' '.join(run.questions) or '-'}\n",
            **session.request(),
            max_tokens=1,
            temperature=temperature,
            seed=rng.randrange(2**31),
            turn={
                "trajectory_id": trajectory,
                "agent": "subagent",
                "agent_id": run.agent_id,
                "frozen": "true",
                "stage": "0",
                "parent_turn_id": decision.generation_id,
            },
        )
    sink.emit(outcome_event(session.envelope, session.trajectory_id, outcome, datetime.now(UTC), settings))
    end_session(sink, session)
    return swarm_record(outcome, decision.policy_version, settings)


def swarm_record(outcome: SwarmOutcome, policy_version: int, settings: SwarmSettings = DEFAULT_SETTINGS) -> SwarmRecord:
    """The product's record of a settled task, answered by ``policy_version``."""
    return SwarmRecord(
        policy_version=policy_version,
        parts=outcome.task.size,
        mode=outcome.mode,
        success=outcome.success,
        score=outcome_score(outcome, settings),
        critical_steps=outcome.critical_steps,
        right_decision=outcome.right_decision,
        serial_collapse=outcome.serial_collapse,
        fake_parallelism=outcome.fake_parallelism,
        subagent_turns=len(outcome.runs),
    )


class SwarmTally(VersionTally[SwarmRecord]):
    """The records of a run by policy version: trajectories, task success, critical steps of one-part and of
    many-part tasks, the parallel share on each, each hack's rate and the garbled share; rates with Wilson
    intervals, means with normal ones."""

    def __init__(self) -> None:
        super().__init__(swarm_figures)


def swarm_figures(version: int, records: list[SwarmRecord]) -> dict[str, Any]:
    """The figures of ``records`` (see :class:`SwarmTally`), as answered by ``version``."""
    one = [r for r in records if r.parts < MANY_PARTS]
    many = [r for r in records if r.parts >= MANY_PARTS]
    return {
        "policy_version": version,
        "trajectories": len(records),
        "success": rate_figure(r.success for r in records),
        "critical_steps_one_part": mean_figure(r.critical_steps for r in one),
        "critical_steps_many_parts": mean_figure(r.critical_steps for r in many),
        "parallel_share_one_part": rate_figure(r.mode == "parallel" for r in one),
        "parallel_share_many_parts": rate_figure(r.mode == "parallel" for r in many),
        "serial_collapse": rate_figure(r.serial_collapse for r in records),
        "fake_parallelism": rate_figure(r.fake_parallelism for r in records),
        "garbled": rate_figure(r.mode == "garbled" for r in records),
    }
