"""The generated benchmark page: results fold into the history and render with their goals judged."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.page import goal_met, main


def _result(name: str, value: float, baseline: float, goal: dict[str, float] | None, day: str) -> dict[str, object]:
    return {
        "name": name,
        "unit": "events/s",
        "value": value,
        "baseline_name": "plain",
        "baseline_value": baseline,
        "ratio": value / baseline,
        "goal": goal,
        "machine": {"cores": 2, "machine": "x86_64", "python": "3.11.2"},
        "runs": 5,
        "measured_at": f"{day}T10:00:00+00:00",
    }


def test_a_new_run_replaces_its_rows_and_keeps_the_others(tmp_path: Path) -> None:
    history, page, results = tmp_path / "benchmarks.json", tmp_path / "benchmarks.md", tmp_path / "results"
    results.mkdir()
    (results / "a.json").write_text(json.dumps(_result("a", 80, 100, {"ratio_at_least": 0.8}, "2026-12-01")))
    (results / "b.json").write_text(json.dumps(_result("b", 50, 100, {"ratio_at_least": 0.8}, "2026-12-01")))
    main(["--results", str(results), "--history", str(history), "--page", str(page)])
    (results / "b.json").unlink()
    (results / "a.json").write_text(json.dumps(_result("a", 95, 100, {"ratio_at_least": 0.8}, "2026-12-05")))
    main(["--results", str(results), "--history", str(history), "--page", str(page)])

    rows = {line.split("|")[1].strip(): line for line in page.read_text().splitlines() if line.startswith("| `")}
    assert set(rows) == {"`a`", "`b`"}
    for needle in ("0.95", "2026-12-05", "| yes |"):
        assert needle in rows["`a`"]
    for needle in ("0.5", "2026-12-01", "| **no** |"):  # b did not run again: its old row stays
        assert needle in rows["`b`"]
    assert json.loads(history.read_text())["a"]["value"] == 95


def test_goals_of_every_shape_are_judged() -> None:
    assert goal_met({"ratio": 1.1, "goal": {"ratio_at_most": 1.2}}) is True
    assert goal_met({"ratio": 1.3, "goal": {"ratio_at_most": 1.2}}) is False
    assert goal_met({"value": 21_000, "goal": {"events_per_s_at_least": 20_000}}) is True
    assert goal_met({"value": 6.0, "goal": {"seconds_at_most": 5.0}}) is False
    assert goal_met({"value": 0.5, "goal": {"p99_s_at_most": 1.0}, "goal_met": False}) is False  # its own word wins
    assert goal_met({"value": 3.0, "goal": None}) is None
