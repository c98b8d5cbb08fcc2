"""An agent scenario's part of the demo report: its figures by policy version, and the issue's verdict on them.

The figures are the simulator's (``SimulationSummary.agents``: per policy version, rates as ``{"rate", "n",
"low", "high"}`` and means as ``{"mean", "n", "low", "high"}``, 95 % intervals); which of them are success,
efficiency, guards and hacks is the scenario's :class:`~liveloop.demo.scenarios.ReportSpec`.

The verdict (issue 39's acceptance) compares the newest promoted version that served trajectories with the base:

- ``improve`` (the scenario's efficiency metric): better, with the two 95 % intervals apart;
- ``hold`` (task success, other efficiency figures): not worse with the intervals apart (overlap, or better);
- ``no_rise`` (each hack, and guards such as swarm's parallel share on one-part tasks): the point estimate is not
  above the upper bound of the base's interval.

A figure without an interval on either side (no trajectories of that kind, or a mean of fewer than two) cannot be
judged, and fails its criterion: the verdict never passes on what was not measured.

The verdict also warns when the base almost never succeeds (:func:`base_warnings`): the loop learns from rewarded
successes, so a base that reaches none leaves it nothing to reinforce, and no verdict on such a run says anything
about the loop. It is the first thing to check of a new task family (docs/agent-learnability.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from liveloop.demo.scenarios import Better, ReportSpec

Rule = Literal["improve", "hold", "no_rise"]

MIN_BASE_SUCCESS = 0.05
"""A base whose success (or success-like efficiency rate) has its 95 % upper bound below this gets a warning: the
loop has (almost) no rewarded success to learn from. The summary and prune bases of December 2026 were at 0.004
and 0.038 (docs/agent-learnability.md); swarm's base, which the loop did teach, at 0.87."""


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Estimate(_Part):
    """A rate or a mean with its 95 % interval; ``value`` None when nothing was measured, bounds None when unknown."""

    value: float | None
    n: int = Field(ge=0)
    low: float | None
    high: float | None


class AgentVersion(_Part):
    """One policy version's figures, keyed as the simulator names them."""

    version: int
    trajectories: int = Field(ge=0)
    figures: dict[str, Estimate]


class FigureSpec(_Part):
    """One figure the report shows: its role, and which way is better."""

    key: str
    role: Literal["success", "efficiency", "guard", "hack", "shown"]
    better: Better | None
    rule: Rule | None = Field(description="What the verdict asks of it; None: shown only.")


class Criterion(_Part):
    """One check of the verdict: the figure, its rule, both estimates, and the outcome in words."""

    figure: str
    rule: Rule
    base: Estimate | None
    final: Estimate | None
    passed: bool
    detail: str


class AgentVerdict(_Part):
    """The last promoted version against the base; ``judged_version`` None (and ``why``) when none served."""

    base_version: int
    judged_version: int | None
    passed: bool
    why: str | None = None
    criteria: list[Criterion] = Field(default_factory=list)
    warnings: list[str] = Field(
        default_factory=list, description="What makes the verdict meaningless whatever it says (base_warnings)."
    )


class AgentReport(_Part):
    """An agent scenario's figures by version, what each figure is, and the verdict.

    With a held-out evaluation (:mod:`liveloop.demo.held_out`) the verdict judges it, and ``served_verdict`` is the
    same comparison on the trajectories each version served, shown beside it."""

    scenario: str
    figures: list[FigureSpec]
    versions: list[AgentVersion]
    verdict: AgentVerdict
    held_out_tasks: int = Field(default=0, ge=0, description="Tasks each checkpoint answered held out; 0: none.")
    held_out: list[AgentVersion] = Field(default_factory=list, description="The base's and the judged version's.")
    served_verdict: AgentVerdict | None = None


def figure_specs(spec: ReportSpec) -> list[FigureSpec]:
    """The report's figures in column order, each with its role and rule."""
    rules: dict[str, Rule | None] = {"improve": "improve", "hold": "hold", "shown": None}
    return [
        FigureSpec(key=spec.success, role="success", better="higher", rule="hold"),
        *(FigureSpec(key=e.key, role="efficiency", better=e.better, rule=rules[e.judged]) for e in spec.efficiency),
        *(FigureSpec(key=key, role="guard", better="lower", rule="no_rise") for key in spec.guards),
        *(FigureSpec(key=key, role="hack", better="lower", rule="no_rise") for key in spec.hacks),
        *(FigureSpec(key=key, role="shown", better=None, rule=None) for key in spec.shown),
    ]


def estimate(raw: Mapping[str, Any]) -> Estimate:
    """A simulator figure (``{"rate"|"mean", "n", "low", "high"}``) as an :class:`Estimate`."""
    value = raw.get("rate", raw.get("mean"))
    n = int(raw.get("n") or 0)
    low, high = raw.get("low"), raw.get("high")
    if n == 0:  # Wilson's (0, 1) for no trials says nothing: keep it out of the comparisons
        low = high = None
    return Estimate(
        value=None if value is None else float(value),
        n=n,
        low=None if low is None else float(low),
        high=None if high is None else float(high),
    )


def agent_versions(spec: ReportSpec, figures: Sequence[Mapping[str, Any]]) -> list[AgentVersion]:
    """The simulator's per-version figures (``SimulationSummary.agents``), the spec's figures kept, oldest first.
    A figure the spec names and the simulator did not report is left out of that version."""
    versions = [agent_version(int(row["policy_version"]), row, spec.figures()) for row in figures]
    return sorted(versions, key=lambda v: v.version)


def agent_version(version: int, row: Mapping[str, Any], wanted: Sequence[str]) -> AgentVersion:
    """One version's figures (a simulator tally's row), those in ``wanted`` kept."""
    return AgentVersion(
        version=version,
        trajectories=int(row.get("trajectories", 0)),
        figures={key: estimate(row[key]) for key in wanted if isinstance(row.get(key), Mapping)},
    )


def judge(rule: Rule, better: Better, base: Estimate | None, final: Estimate | None) -> tuple[bool, str]:
    """Whether ``final`` meets ``rule`` against ``base`` (see the module docstring), and why, in words."""
    if base is None or final is None or base.low is None or base.high is None or final.value is None:
        return False, "cannot judge: not measured on both versions"
    if rule == "no_rise":
        ok = final.value <= base.high
        return ok, f"{final.value:.3f} {'<=' if ok else '>'} base's upper bound {base.high:.3f}"
    if final.low is None or final.high is None:
        return False, "cannot judge: no interval on the judged version"
    if better == "higher":
        better_apart, worse_apart = final.low > base.high, final.high < base.low
    else:
        better_apart, worse_apart = final.high < base.low, final.low > base.high
    span = f"{final.low:.3f}-{final.high:.3f} vs base {base.low:.3f}-{base.high:.3f}"
    if rule == "improve":
        return (
            better_apart,
            f"{span}: {'better, intervals apart' if better_apart else 'not better with intervals apart'}",
        )
    return not worse_apart, f"{span}: {'worse, intervals apart' if worse_apart else 'intervals overlap or better'}"


def base_warnings(figures: Sequence[FigureSpec], base: AgentVersion | None) -> list[str]:
    """A warning for each success-like figure (the success figure, and each efficiency figure to improve where
    higher is better) on which the base almost never succeeds: its 95 % upper bound under :data:`MIN_BASE_SUCCESS`."""
    if base is None:
        return []
    warnings = []
    for spec in figures:
        if spec.better != "higher" or not (spec.role == "success" or spec.rule == "improve"):
            continue
        found = base.figures.get(spec.key)
        if found is None or found.value is None or found.high is None or found.high >= MIN_BASE_SUCCESS:
            continue
        warnings.append(
            f"the base's {spec.key} is {found.value:.3f} (95 % upper bound {found.high:.3f}, n {found.n}): the loop "
            "learns from rewarded successes and the base almost never reaches one, so this run cannot show "
            "learning; pre-train the base further or make the task learnable for it first"
        )
    return warnings


def agent_verdict(
    figures: Sequence[FigureSpec], versions: Sequence[AgentVersion], promoted: Sequence[int], base_version: int
) -> AgentVerdict:
    """The newest promoted version (``promoted``: the versions the alias moved to, oldest first) that served
    trajectories, judged against the base on every figure with a rule."""
    by_version = {v.version: v for v in versions if v.trajectories > 0}
    base = by_version.get(base_version)
    warnings = base_warnings(figures, base)
    served = [v for v in promoted if v in by_version and v != base_version]
    if base is None or not served:
        why = "the base served no trajectories" if base is None else "no promoted checkpoint served trajectories"
        return AgentVerdict(base_version=base_version, judged_version=None, passed=False, why=why, warnings=warnings)
    final = by_version[served[-1]]
    criteria = []
    for spec in figures:
        if spec.rule is None or spec.better is None:
            continue
        before, after = base.figures.get(spec.key), final.figures.get(spec.key)
        passed, detail = judge(spec.rule, spec.better, before, after)
        criteria.append(
            Criterion(figure=spec.key, rule=spec.rule, base=before, final=after, passed=passed, detail=detail)
        )
    failed = [c.figure for c in criteria if not c.passed]
    return AgentVerdict(
        base_version=base_version,
        judged_version=final.version,
        passed=not failed,
        why=f"failed: {', '.join(failed)}" if failed else None,
        criteria=criteria,
        warnings=warnings,
    )


def build_agent_report(
    scenario: str, spec: ReportSpec, raw: Sequence[Mapping[str, Any]], promoted: Sequence[int], base_version: int
) -> AgentReport:
    """The agent part of the report from the simulator's figures and the alias moves."""
    figures = figure_specs(spec)
    versions = agent_versions(spec, raw)
    return AgentReport(
        scenario=scenario,
        figures=figures,
        versions=versions,
        verdict=agent_verdict(figures, versions, promoted, base_version),
    )


def with_held_out(report: AgentReport, figures: Mapping[int, Mapping[str, Any]], tasks: int) -> AgentReport:
    """``report`` with the held-out evaluation: ``figures`` by version, each measured on the same ``tasks`` tasks.

    With the version the served verdict judged among them, the verdict judges them instead, the served verdict
    kept beside it; with the base alone (nothing promoted served), they are shown and the verdict stays."""
    wanted = [spec.key for spec in report.figures]
    versions = [agent_version(version, row, wanted) for version, row in sorted(figures.items())]
    update: dict[str, Any] = {"held_out_tasks": tasks, "held_out": versions}
    judged = report.verdict.judged_version
    if judged is not None and judged in figures:
        base = report.verdict.base_version
        update |= {
            "verdict": agent_verdict(report.figures, versions, [judged], base),
            "served_verdict": report.verdict,
        }
    return report.model_copy(update=update)


def format_estimate(value: Estimate | None) -> str:
    """``0.412 (0.35-0.47, n 120)``; ``-`` when nothing was measured."""
    if value is None or value.value is None:
        return "-"
    if value.low is None or value.high is None:
        return f"{value.value:.3f} (n {value.n})"
    return f"{value.value:.3f} ({value.low:.3f}-{value.high:.3f}, n {value.n})"


def agent_markdown(report: AgentReport) -> list[str]:
    """``report.md``'s agent section: the verdict and its criteria, then every figure by version."""
    lines = ["## Verdict", ""]
    if report.served_verdict is not None:
        lines += [
            f"Measured held out: each checkpoint sampled on the same {report.held_out_tasks} fixed tasks, as the "
            "gateway samples (liveloop/demo/held_out.py); the served trajectories' verdict follows it.",
            "",
        ]
    lines += _verdict_lines(report.verdict)
    if report.served_verdict is not None:
        lines += ["### The same on served trajectories (shown, not judged)", ""]
        lines += _verdict_lines(report.served_verdict)
    lines += [
        "Rules: improve = better with 95 % intervals apart; hold = not worse with intervals apart; no_rise = the "
        "point estimate not above the upper bound of the base's 95 % interval.",
        "",
    ]
    if report.held_out:
        lines += [f"## Held out: {report.held_out_tasks} fixed tasks per checkpoint (95 % intervals)", ""]
        lines += ["| figure | " + " | ".join(f"version {v.version}" for v in report.held_out) + " |"]
        lines += ["|---|" + "---|" * len(report.held_out)]
        for spec in report.figures:
            cells = " | ".join(format_estimate(v.figures.get(spec.key)) for v in report.held_out)
            lines.append(f"| {spec.key} | {cells} |")
        lines.append("")
    lines += ["## Figures by policy version (95 % intervals)", ""]
    for spec in report.figures:
        direction = f", {spec.better} is better" if spec.better else ""
        lines += [f"### {spec.key} ({spec.role}{direction})", "", "| version | trajectories | value |", "|---|---|---|"]
        for version in report.versions:
            lines.append(
                f"| {version.version} | {version.trajectories} | {format_estimate(version.figures.get(spec.key))} |"
            )
        lines.append("")
    return lines


def _verdict_lines(v: AgentVerdict) -> list[str]:
    lines = [f"**Warning:** {warning}." for warning in v.warnings]
    lines += [""] if v.warnings else []
    if v.judged_version is None:
        return [*lines, f"Nothing to judge: {v.why}.", ""]
    outcome = "**passed**" if v.passed else f"**not passed** ({v.why})"
    lines += [f"Version {v.judged_version} (the newest promoted one that served) against the base, "
              f"version {v.base_version}: {outcome}.", ""]  # fmt: skip
    lines += ["| figure | rule | base | judged | outcome |", "|---|---|---|---|---|"]
    for c in v.criteria:
        mark = "ok" if c.passed else "FAIL"
        lines.append(
            f"| {c.figure} | {c.rule} | {format_estimate(c.base)} | {format_estimate(c.final)} | {mark}: {c.detail} |"
        )
    return [*lines, ""]
