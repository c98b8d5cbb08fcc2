"""The generated benchmark page: results fold into the history and render with their goals judged."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench import capacity
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


def _capacity_results(gpu_tokens_per_s: float | None) -> dict[str, dict[str, object]]:
    distill = _result("distill_workers_throughput", 8_000, 10_000, None, "2026-12-05")
    distill.update(
        partitions=6,
        one_worker_events_per_s=10_000.0,
        one_worker_one_partition_events_per_s=3_000.0,
        cpu={"one": {"us_per_event": 40.0}},
    )
    results = {"distill_workers_throughput": distill}
    if gpu_tokens_per_s is not None:
        gpu = _result("learner_gpu_cycle_0.5b_bf16_learner", gpu_tokens_per_s, 989, None, "2026-12-05")
        gpu["extra"] = {"gpu": "NVIDIA H100"}
        results[str(gpu["name"])] = gpu
    return results


def _capacity_rows(page: str) -> dict[str, str]:
    return {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| ")}


def test_the_capacity_model_sizes_the_example_from_the_measured_rates() -> None:
    # The example provisions 5,000 x 2 = 10,000 events/s and trains 2,000 / 4 x 18,000 s x 0.9 samples per cadence.
    rows = _capacity_rows(capacity.render(_capacity_results(gpu_tokens_per_s=50_000)))
    assert "| 1 |" in rows["distiller workers"]  # 10,000 / 10,000 per worker
    assert "| 4 |" in rows["events-topic partitions"]  # 10,000 / 3,000 per partition, rounded up
    assert "| 9,000,000 |" in rows["samples per cadence"]
    assert "| 9 |" in rows["learner GPUs"]  # 450,000 tokens/s / 50,000 per GPU
    assert "NVIDIA H100" in rows["learner, tokens/s per GPU (NVIDIA H100, ~0.5B bf16)"]


def test_a_figure_without_a_result_is_missing_not_guessed() -> None:
    rows = _capacity_rows(capacity.render(_capacity_results(gpu_tokens_per_s=None)))
    assert "| missing |" in rows["learner GPUs"]
    assert "**missing**" in rows["learner, tokens/s per GPU"]
    assert "missing" in rows["archiver replicas"]


def test_the_committed_capacity_page_is_generated_from_the_committed_results() -> None:
    history = json.loads(capacity.HISTORY.read_text(encoding="utf-8"))
    assert capacity.PAGE.read_text(encoding="utf-8") == capacity.render(history), (
        "docs/capacity.md differs from its results: run `python -m tests.bench.capacity`"
    )
