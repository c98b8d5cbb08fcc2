"""Writing one benchmark's result as DESIGN.md's "Benchmarks" section shapes it, and a one-line summary.

Every benchmark calls :func:`write_result` once; ``make bench`` collects ``bench-results/<name>.json``.
"""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench-results"
_STANDARD = ("name", "unit", "value", "baseline_name", "baseline_value", "ratio", "goal", "machine", "runs")


def machine() -> dict[str, Any]:
    """What the numbers were measured on: they only compare within one machine."""
    return {
        "cores": os.cpu_count(),
        # Other work on the machine moves absolute figures (and, less, ratios): say how busy it was.
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def write_result(
    name: str,
    unit: str,
    value: float,
    baseline_name: str,
    baseline_value: float,
    goal_ratio: float | None,
    runs: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``bench-results/<name>.json`` and print a one-line summary; return what was written.

    ``ratio`` is ``value / baseline_value`` (null when the baseline is 0). ``goal_ratio`` becomes
    ``{"ratio_at_least": goal_ratio}``; pass None when the goal is not a ratio and put your own
    ``"goal"`` in ``extra``. Other ``extra`` keys are added beside the standard ones, never over them.
    """
    ratio = value / baseline_value if baseline_value else None
    result: dict[str, Any] = {
        "name": name,
        "unit": unit,
        "value": value,
        "baseline_name": baseline_name,
        "baseline_value": baseline_value,
        "ratio": ratio,
        "goal": {"ratio_at_least": goal_ratio} if goal_ratio is not None else None,
        "machine": machine(),
        "runs": runs,
    }
    extra = dict(extra or {})
    if goal_ratio is None and "goal" in extra:
        result["goal"] = extra.pop("goal")
    clashes = sorted(set(extra) & set(_STANDARD))
    if clashes:
        raise ValueError(f"extra must not replace the standard keys {clashes}; rename them")
    result.update(extra)
    result["measured_at"] = result.get("measured_at", datetime.now(UTC).isoformat(timespec="seconds"))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    shown = "n/a" if ratio is None else f"{ratio:.2f}"
    goal = (
        "" if goal_ratio is None else f" (goal >= {goal_ratio}: {'met' if ratio and ratio >= goal_ratio else 'missed'})"
    )
    print(
        f"[bench] {name}: {value:,.1f} {unit} vs {baseline_value:,.1f} ({baseline_name}), "
        f"ratio {shown}{goal}, median of {runs} runs",
        flush=True,
    )
    return result
