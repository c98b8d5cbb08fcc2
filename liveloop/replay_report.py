"""What ``liveloop replay`` writes: ``report.json``, ``report.md`` and ``rewards.png`` (recorded vs re-derived
reward distributions, in the demo plot's style), beside the ``differences.jsonl`` the command streams."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distill.replay_range import BINS, RangeComparison

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
PLOT = "rewards.png"
DIFFERENCES = "differences.jsonl"
"""Every differing generation, one JSON object a line (the reports list only the first few)."""


def write_reports(result: RangeComparison, folder: Path) -> list[Path]:
    """Write the JSON and Markdown reports and the plot into ``folder``; return their paths."""
    document = result.as_dict()
    (folder / REPORT_JSON).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / REPORT_MD).write_text(markdown(document), encoding="utf-8")
    plot_rewards(result, folder / PLOT)
    return [folder / REPORT_JSON, folder / REPORT_MD, folder / PLOT]


def markdown(document: dict[str, Any]) -> str:
    """``report.md`` from the JSON document."""
    counts = document["counts"]
    deltas = document["component_deltas"]
    shift = document["distribution"]
    listed = document["first_differences"]
    verdict = "no differences" if document["no_differences"] else "differences found"
    lines = [
        "# Replay report",
        "",
        f"Range {document['range']}; recorded spec `{document['recorded_spec_hash']}`, "
        f"replayed under `{document['replay_spec_hash']}`: **{verdict}**.",
        "",
        "| count | value |",
        "|---|---:|",
        *(f"| {name} | {value} |" for name, value in counts.items()),
        "",
        "## Reward component deltas (re-derived minus recorded, over differing generations)",
        "",
        "| component | changed | total | mean | min | max |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {name} | {d['changed']} | {d['total']:.6g} | {d['mean']:.6g} | {d['min']:.6g} | {d['max']:.6g} |"
            for name, d in deltas.items()
        ),
        "",
        "## Distribution shift",
        "",
        f"Mean reward {shift['recorded']['mean']:.6g} recorded, {shift['replayed']['mean']:.6g} re-derived "
        f"(shift {shift['mean_shift']:+.6g}); total variation between the histograms {shift['total_variation']:.4f}. "
        f"See `{PLOT}`.",
        "",
        f"## Differing samples (first {len(listed)}; all in `{DIFFERENCES}`)",
        "",
        "| kind | session | generation | recorded reward | re-derived reward |",
        "|---|---|---|---:|---:|",
        *(
            f"| {d['kind']} | {d['session_id']} | {d['generation_id']} | {d.get('recorded_reward', '-')} "
            f"| {d.get('replayed_reward', '-')} |"
            for d in listed
        ),
        "",
    ]
    return "\n".join(lines)


def plot_rewards(result: RangeComparison, path: Path) -> None:
    """Recorded and re-derived reward histograms side by side (the demo plot's size, dpi and layout)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    low, high = result.recorded_rewards.low, result.recorded_rewards.high
    width = (high - low) / BINS
    centres = [low + width * (i + 0.5) for i in range(BINS)]
    figure, axes = plt.subplots(figsize=(9, 4.5))
    axes.bar([c - width * 0.2 for c in centres], result.recorded_rewards.histogram, width=width * 0.4, label="recorded")
    axes.bar(
        [c + width * 0.2 for c in centres], result.replayed_rewards.histogram, width=width * 0.4, label="re-derived"
    )
    axes.set_xlabel("reward")
    axes.set_ylabel("samples")
    axes.legend(loc="upper left", fontsize=8)
    axes.set_title(f"Rewards: recorded vs re-derived ({result.differing} differing)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
