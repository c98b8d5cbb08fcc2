"""The demo's plots: ``acceptance.png`` (code: acceptance rate by version over the run, alias moves marked with
the version they moved to) and ``figures.png`` (an agent scenario: each figure by version, 95 % intervals)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from liveloop.demo.simulator.summary import SimulationSummary

if TYPE_CHECKING:
    from liveloop.demo.agent_report import AgentReport
    from liveloop.demo.report import DemoReport


def plot_acceptance(report: DemoReport, summary: SimulationSummary, path: Path) -> None:
    """Draw acceptance per version per timeline bucket (from the simulator) and the report's alias moves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for version in sorted({point.policy_version for point in summary.timeline}):
        points = [p for p in summary.timeline if p.policy_version == version and p.requests > 0]
        axes.plot(
            [p.start_s / 60 for p in points],
            [p.accepted / p.requests for p in points],
            marker="o",
            label=f"v{version}",
        )
    for move in report.promotions:
        at = (move.at - summary.started_at).total_seconds() / 60
        if at >= 0:
            axes.axvline(at, color="grey", linestyle="--", linewidth=0.8)
            axes.annotate(move_label(move.action, move.to_version), (at, 1.0), rotation=90, fontsize=7, va="top")
    axes.set_xlabel("minutes into the run")
    axes.set_ylabel("acceptance rate")
    axes.set_ylim(0, 1.05)
    axes.legend(loc="lower right", fontsize=8)
    axes.set_title("Acceptance by version (dashed: alias moves)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def move_label(action: str, to_version: int | None) -> str:
    """The mark of an alias move on the plot: ``promote -> v3`` (a rejection names no version)."""
    return f"{action} -> v{to_version}" if to_version is not None else action


def plot_agent_figures(report: AgentReport, path: Path) -> None:
    """One panel per figure of an agent scenario (success, efficiency, guards, hacks, shown): its value by policy
    version with the 95 % interval as an error bar; the base and the judged version are marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = report.figures
    columns = 3
    rows = max(1, -(-len(specs) // columns))
    figure, grid = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    judged = report.verdict.judged_version
    for index, spec in enumerate(specs):
        axes = grid[index // columns][index % columns]
        points = [(v.version, v.figures[spec.key]) for v in report.versions if spec.key in v.figures]
        points = [(version, e) for version, e in points if e.value is not None]
        for version, e in points:
            value = float(e.value)  # type: ignore[arg-type]  # filtered above
            low = value if e.low is None else e.low
            high = value if e.high is None else e.high
            colour = (
                "tab:green"
                if version == judged
                else "tab:grey"
                if version == report.verdict.base_version
                else "tab:blue"
            )
            axes.errorbar([version], [value], yerr=[[value - low], [high - value]], fmt="o", color=colour, capsize=3)
        better = f", {spec.better} better" if spec.better else ""
        axes.set_title(f"{spec.key} ({spec.role}{better})", fontsize=8)
        axes.set_xlabel("policy version", fontsize=7)
        axes.tick_params(labelsize=7)
        if points:
            axes.set_xticks(sorted({version for version, _ in points}))
    for index in range(len(specs), rows * columns):
        grid[index // columns][index % columns].set_visible(False)
    figure.suptitle(f"{report.scenario}: by policy version, 95 % intervals (grey: base, green: judged)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
