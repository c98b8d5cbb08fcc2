"""``acceptance.png``: acceptance rate by version over the run, alias moves marked with the version they moved to."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from liveloop.demo.simulator.summary import SimulationSummary

if TYPE_CHECKING:
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
