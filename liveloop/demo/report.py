"""The demo's report: :class:`DemoReport`, written as ``report.json`` (its ``model_dump_json``), ``report.md``
(for people) and a plot (:mod:`liveloop.demo.plot`): ``acceptance.png`` for the code scenario (acceptance by
version over time, alias moves marked), ``figures.png`` for an agent scenario (each figure by version with its
95 % interval; the figures and their verdict are :mod:`liveloop.demo.agent_report`'s).

Acceptance per version comes from the simulator (what users did with each version's completions);
rewards, deferrals and the lineage come from the audit store; decisions and alias moves from the
``evaluations`` and ``promotions`` tables, so the report shows what was recorded, not what the demo
believes happened.

A checkpoint has one number, its version: the number serving reports with every completion, samples
carry, the gate judges and MLflow registered it under (the ``promotions`` table's from/to). The report
never maps one numbering onto another, and takes the base model's version as given by whoever
registered it, so it holds whatever the base is numbered.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg import sql
from pydantic import BaseModel, ConfigDict, Field

from infra.stack import Stack
from liveloop.demo.agent_report import AgentReport, agent_markdown, build_agent_report, with_held_out
from liveloop.demo.held_out import HELD_OUT_TASKS, HeldOutEvaluation, checkpoint_folder
from liveloop.demo.scenarios import CODE, Scenario
from liveloop.demo.simulator.stats import intervals_overlap
from liveloop.demo.simulator.summary import SimulationSummary

log = logging.getLogger(__name__)

_COUNT = sql.SQL("SELECT count(*) FROM {}")
IMPROVEMENT_POINTS = 15.0
"""The acceptance gain, in percentage points, that counts as the loop having improved the model."""


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VersionResult(_Part):
    """What users did with one version's completions (simulator) and what the audit store holds of it."""

    version: int
    requests: int = Field(ge=0)
    accepted: int = Field(ge=0)
    acceptance_rate: float = Field(ge=0, le=1)
    acceptance_ci95: tuple[float, float] = Field(description="Wilson 95 % interval of the acceptance rate.")
    preferred: int = Field(ge=0, description="Completions the users' hidden preference liked (before noise).")
    invalid_tool_calls: int = Field(ge=0, description="Tool calls reported invalid (the loophole).")
    invalid_tool_call_rate: float = Field(ge=0, description="Invalid tool calls per request.")
    distinct_completions: int = Field(default=0, ge=0, description="Different completion texts this version served.")
    distinct_share: float = Field(
        default=0.0, ge=0, le=1, description="distinct_completions / requests: falls as outputs collapse."
    )
    well_formed: int = Field(default=0, ge=0, description="Completions well-formed in the simulator's language.")
    well_formed_share: float = Field(default=0.0, ge=0, le=1, description="well_formed / requests.")
    mean_reward: float | None = Field(description="Mean reward of this version's samples; None without samples.")
    deferral_rate: float | None = Field(description="Share of its samples with a deferred reward; None without.")
    samples: int = Field(ge=0, description="Samples the distiller made of this version's completions.")


class Checkpoint(_Part):
    """A checkpoint the learner wrote (the base model is not one)."""

    version: int
    created_at: datetime


class GateDecision(_Part):
    """The gate's decision on one checkpoint, with its reasons and metrics as the gate recorded them."""

    version: int
    decision: Literal["promote", "reject", "hold"]
    reasons: list[Any]
    metrics: dict[str, Any]


class Promotion(_Part):
    """One move of the champion alias, or an operator's rejection: a row of the ``promotions`` table."""

    action: Literal["promote", "rollback", "reject"]
    from_version: int | None
    to_version: int | None
    actor: str
    reason: str
    at: datetime


class Counts(_Part):
    """Rows in the audit store at the end."""

    events: int = Field(ge=0)
    samples: int = Field(ge=0)
    dead_letters: int = Field(ge=0)


class SimulatorStats(_Part):
    """What the simulated users did."""

    sessions: int = Field(ge=0)
    requests: int = Field(ge=0)
    request_errors: int = Field(ge=0)
    privacy_sessions: int = Field(ge=0)
    planted_secrets: int = Field(ge=0)
    malformed_sent: int = Field(ge=0)
    malformed_dead_lettered: int = Field(ge=0)


class LeakScan(_Part):
    """What the leak scan looked for, and where it found any of it (place -> count; empty: nowhere)."""

    secrets: int = Field(ge=0, description="Planted secrets looked for.")
    privacy_sessions: int = Field(ge=0, description="Private sessions whose ids were looked for.")
    found: dict[str, int]


class Comparison(_Part):
    """The newest promoted version that served requests, against the base."""

    judged_version: int
    base_acceptance: float
    final_acceptance: float
    acceptance_gain_points: float
    intervals_separate: bool = Field(description="Whether the two 95 % intervals do not overlap.")
    loophole_not_exploited: bool = Field(description="Invalid tool calls per request did not rise.")


class Verdict(_Part):
    """Did the loop make the model better? ``comparison`` is None (and ``why`` says why) when nothing can be judged."""

    promotions: int = Field(ge=0, description="Promotions away from an earlier champion.")
    improved: bool
    why: str | None = None
    comparison: Comparison | None = None


class DemoReport(_Part):
    """Everything ``liveloop demo`` reports; ``report.json`` is this model's JSON."""

    seed: int
    scenario: str = Field(default="code", description="The demo scenario (liveloop.demo.scenarios).")
    profile: str
    minutes: float
    base_version: int = Field(description="The base model's version: the first champion.")
    final_champion: int = Field(description="The champion's version at the end.")
    versions: list[VersionResult]
    checkpoints: list[Checkpoint]
    gate_decisions: list[GateDecision]
    promotions: list[Promotion]
    counts: Counts
    simulator: SimulatorStats
    leaks: LeakScan
    verdict: Verdict = Field(description="Code: acceptance gained; an agent scenario: its verdict (agents.verdict).")
    agents: AgentReport | None = Field(default=None, description="An agent scenario's figures and verdict.")


def collect_report(
    stack: Stack,
    summary: SimulationSummary,
    profile: str,
    minutes: float,
    base_version: int,
    leaks: LeakScan,
    scenario: Scenario = CODE,
    held_out_tasks: int = HELD_OUT_TASKS,
) -> DemoReport:
    """Gather the report from the simulator's summary, the leak scan and the audit store (and, for an agent scenario
    with a held-out evaluation, ``held_out_tasks`` fixed tasks answered by the base and the judged checkpoint)."""
    with psycopg.connect(stack.endpoints.dsn()) as conn:
        # The base is the lineage's root, the one checkpoint without a parent.
        lineage = conn.execute(
            "SELECT policy_version, created_at FROM checkpoints WHERE parent_id IS NOT NULL ORDER BY policy_version"
        ).fetchall()
        rewards = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT policy_version, avg(reward), avg(CASE WHEN (body->>'deferral')::boolean THEN 1.0 ELSE 0.0 END),"
                " count(*) FROM samples GROUP BY policy_version"
            ).fetchall()
        }
        decisions = conn.execute(
            "SELECT c.policy_version, e.decision, e.reasons, e.metrics "
            "FROM evaluations e JOIN checkpoints c USING (checkpoint_id) ORDER BY e.decided_at"
        ).fetchall()
        moves = conn.execute(
            "SELECT action, from_version, to_version, actor, reason, at FROM promotions ORDER BY id"
        ).fetchall()
        counts = {
            table: int(conn.execute(_COUNT.format(sql.Identifier(table))).fetchone()[0])  # type: ignore[index]
            for table in ("events", "samples", "dead_letters")
        }
    versions = []
    for stats in summary.versions:
        mean_reward, deferral_rate, samples = rewards.get(stats.policy_version, (None, None, 0))
        versions.append(
            VersionResult(
                version=stats.policy_version,
                **stats.model_dump(exclude={"policy_version"}),
                mean_reward=float(mean_reward) if mean_reward is not None else None,
                deferral_rate=float(deferral_rate) if deferral_rate is not None else None,
                samples=int(samples),
            )
        )
    promotions = [
        Promotion(action=a, from_version=f, to_version=t, actor=actor, reason=reason, at=at)
        for a, f, t, actor, reason, at in moves
    ]
    moved = [p.to_version for p in promotions if p.action in ("promote", "rollback") and p.to_version is not None]
    agents, judged = None, verdict(versions, promotions, base_version)
    if scenario.report is not None:
        promoted = [p.to_version for p in promotions if p.action == "promote" and p.from_version is not None]
        agents = build_agent_report(
            scenario.name, scenario.report, summary.agents, [v for v in promoted if v is not None], base_version
        )
        if scenario.held_out is not None:
            agents = judge_held_out(agents, scenario.held_out, stack.settings.state_dir, held_out_tasks)
        judged = Verdict(promotions=len(promoted), improved=agents.verdict.passed, why=agents.verdict.why)
    return DemoReport(
        seed=summary.seed,
        scenario=scenario.name,
        profile=profile,
        minutes=minutes,
        base_version=base_version,
        final_champion=moved[-1] if moved else base_version,
        versions=versions,
        checkpoints=[Checkpoint(version=v, created_at=created) for v, created in lineage],
        gate_decisions=[GateDecision(version=v, decision=d, reasons=r, metrics=m) for v, d, r, m in decisions],
        promotions=promotions,
        counts=Counts(**counts),
        simulator=SimulatorStats(
            sessions=summary.sessions,
            requests=summary.requests,
            request_errors=summary.request_errors,
            privacy_sessions=summary.privacy_sessions,
            planted_secrets=len(summary.planted_secrets),
            malformed_sent=summary.malformed_sent,
            malformed_dead_lettered=summary.malformed_dead_lettered,
        ),
        leaks=leaks,
        verdict=judged,
        agents=agents,
    )


def judge_held_out(
    agents: AgentReport, evaluation: HeldOutEvaluation, state_dir: Path, tasks: int = HELD_OUT_TASKS
) -> AgentReport:
    """``agents`` with the held-out evaluation of the base and of the version its served verdict judged, if any
    (their checkpoints in the demo's learner folder), which the verdict then judges (:func:`with_held_out`); as it
    was, with a warning saying why, if one cannot be measured."""
    versions = [agents.verdict.base_version]
    if agents.verdict.judged_version is not None:
        versions.append(agents.verdict.judged_version)
    try:
        figures = {version: evaluation(checkpoint_folder(state_dir, version), tasks) for version in versions}
    except Exception as exc:  # a report must come out of a finished run; the served verdict still says something
        log.warning("held-out evaluation failed; the verdict stays on served trajectories", exc_info=True)
        warning = f"the held-out evaluation failed ({exc}); the verdict judges served trajectories"
        verdict = agents.verdict.model_copy(update={"warnings": [*agents.verdict.warnings, warning]})
        return agents.model_copy(update={"verdict": verdict})
    return with_held_out(agents, figures, tasks)


def verdict(versions: list[VersionResult], promotions: list[Promotion], base_version: int) -> Verdict:
    """The newest promoted version that users met against the base champion (``base_version``)."""
    by_version = {v.version: v for v in versions}
    moves = [p for p in promotions if p.action == "promote" and p.from_version is not None]
    # The newest promoted checkpoint that users met: one promoted in the last seconds served nobody yet.
    served = [p.to_version for p in moves if p.to_version in by_version]
    base = by_version.get(base_version)
    final = by_version.get(served[-1]) if served and served[-1] is not None else None
    if base is None or final is None:
        return Verdict(promotions=len(moves), improved=False, why="no promoted checkpoint served requests")
    gain = round(100 * (final.acceptance_rate - base.acceptance_rate), 1)
    separate = not intervals_overlap(base.acceptance_ci95, final.acceptance_ci95)
    comparison = Comparison(
        judged_version=final.version,
        base_acceptance=base.acceptance_rate,
        final_acceptance=final.acceptance_rate,
        acceptance_gain_points=gain,
        intervals_separate=separate,
        loophole_not_exploited=final.invalid_tool_call_rate <= base.invalid_tool_call_rate,
    )
    return Verdict(promotions=len(moves), improved=gain >= IMPROVEMENT_POINTS and separate, comparison=comparison)


def plot_name(report: DemoReport) -> str:
    """The plot's file name: ``acceptance.png`` (code), ``figures.png`` (an agent scenario)."""
    return "acceptance.png" if report.agents is None else "figures.png"


def write_report(report: DemoReport, summary: SimulationSummary, directory: Path) -> list[Path]:
    """Write report.json, report.md and the plot (:func:`plot_name`) into ``directory``; return their paths."""
    from liveloop.demo.plot import plot_acceptance, plot_agent_figures

    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "report.json", directory / "report.md", directory / plot_name(report)]
    paths[0].write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(report), encoding="utf-8")
    if report.agents is None:
        plot_acceptance(report, summary, paths[2])
    else:
        plot_agent_figures(report.agents, paths[2])
    return paths


def markdown(report: DemoReport) -> str:
    """``report.md``: the verdict, acceptance (code) or the agent figures by version, the gate's decisions, the
    alias moves, the leak scan."""
    title = f"profile `{report.profile}`" if report.agents is None else f"scenario `{report.scenario}`"
    lines = [
        f"# liveloop demo: {title}, seed {report.seed}, {report.minutes:g} minutes",
        "",
        f"Base champion: version {report.base_version}; final champion: version {report.final_champion}.",
        "",
    ]
    if report.agents is not None:
        lines += agent_markdown(report.agents)
    else:
        lines += _acceptance_lines(report)
    return "\n".join(lines + _loop_lines(report))


def _acceptance_lines(report: DemoReport) -> list[str]:
    lines: list[str] = []
    c = report.verdict.comparison
    if c is not None:
        lines += [
            f"Acceptance went from {c.base_acceptance:.3f} (base) to {c.final_acceptance:.3f} (version "
            f"{c.judged_version}, the newest promoted one that served requests) "
            f"({c.acceptance_gain_points:+.1f} points; 95 % intervals "
            f"{'do not overlap' if c.intervals_separate else 'overlap'}). "
            f"Loophole {'not exploited' if c.loophole_not_exploited else 'EXPLOITED'}.",
            "",
        ]
    else:
        lines += [f"No improvement to report: {report.verdict.why}.", ""]
    lines += [
        "| version | requests | acceptance | 95 % interval | mean reward | invalid tool calls | distinct share "
        "| well-formed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for item in report.versions:
        low, high = item.acceptance_ci95
        reward = "" if item.mean_reward is None else f"{item.mean_reward:.3f}"
        lines.append(
            f"| {item.version} | {item.requests} | {item.acceptance_rate:.3f} | {low:.3f}-{high:.3f} | {reward} | "
            f"{item.invalid_tool_call_rate:.3f} | {item.distinct_share:.3f} | {item.well_formed_share:.3f} |"
        )
    return lines


def _loop_lines(report: DemoReport) -> list[str]:
    lines = ["", "## Gate decisions", ""]
    for d in report.gate_decisions:
        failed = [r for r in d.reasons if isinstance(r, str) and r.startswith("FAIL")] or d.reasons[:2]
        lines.append(f"- version {d.version}: **{d.decision}** ({'; '.join(map(str, failed))})")
    lines += ["", "## Alias moves", ""]
    for p in report.promotions:
        lines.append(f"- {p.at.isoformat()}: {p.action} {p.from_version} → {p.to_version} by {p.actor} ({p.reason})")
    counts, leaks = report.counts, report.leaks
    what = f"{leaks.secrets} planted secrets and {leaks.privacy_sessions} private sessions"
    found = ", ".join(f"{place} ({count})" for place, count in leaks.found.items())
    lines += [
        "",
        f"Archived events: {counts.events:,}; samples: {counts.samples:,}; dead letters: {counts.dead_letters:,}.",
        "",
        f"Leak scan for {what} over every topic, table, MLflow artifact and checkpoint: "
        + (f"FOUND in {found}." if found else "nothing found."),
        "",
    ]
    return lines
