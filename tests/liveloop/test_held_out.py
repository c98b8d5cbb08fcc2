"""The held-out evaluation of an agent scenario (liveloop/demo/held_out.py) and the verdict that judges it."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.checkpoint import checkpoint_id_for
from learner.settings import LearnerSettings
from learner.tiny_model import TinyModelSpec, save_tiny_model
from liveloop.demo.agent_report import agent_markdown, build_agent_report
from liveloop.demo.held_out import checkpoint_folder, held_out_rng, swarm_held_out
from liveloop.demo.report import judge_held_out
from liveloop.demo.scenarios import SWARM
from liveloop.demo.simulator.swarm import draw_task, task_rng
from tests.liveloop.test_demo_scenarios import LEARNED, SPEC, _swarm_row

TASKS = 12


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("held-out") / "model", TinyModelSpec(seed=3))


def test_a_checkpoint_answers_every_held_out_task_and_the_same_ones_each_time(tiny_checkpoint: Path) -> None:
    first = swarm_held_out(tiny_checkpoint, TASKS)
    assert first["trajectories"] == TASKS
    one, many = first["critical_steps_one_part"]["n"], first["critical_steps_many_parts"]["n"]
    assert one + many == TASKS
    assert one > 0
    assert many > 0
    assert first["success"]["n"] == first["garbled"]["n"] == TASKS
    # Sampled with each task's own seed: the same checkpoint meets the same tasks with the same random numbers.
    assert swarm_held_out(tiny_checkpoint, TASKS) == first


def test_the_held_out_tasks_are_none_of_a_runs_tasks() -> None:
    held_out = [draw_task(held_out_rng(i)).prompt() for i in range(50)]
    assert len(set(held_out)) > 10  # drawn, not one task repeated
    for seed in (0, 1, 2, 999):
        run = [draw_task(task_rng(seed, i)) for i in range(50)]
        draws = [[(p.steps, p.subagent_fails) for p in task.parts] for task in run]
        assert draws != [[(p.steps, p.subagent_fails) for p in draw_task(held_out_rng(i)).parts] for i in range(50)]


def test_the_verdict_judges_the_held_out_figures_and_keeps_the_served_one_beside_it() -> None:
    # Served: version 3 learned; held out, the same two checkpoints show no change. The held-out verdict decides.
    served = build_agent_report("swarm", SPEC, [_swarm_row(1), _swarm_row(3, **LEARNED)], [3], 1)
    assert served.verdict.passed

    def no_change(folder: Path, tasks: int) -> dict[str, object]:
        return _swarm_row(0, trajectories=tasks)

    judged = judge_held_out(served, no_change, Path("/state"))
    assert judged.held_out_tasks == 400
    assert [v.version for v in judged.held_out] == [1, 3]
    assert not judged.verdict.passed
    assert "critical_steps_many_parts" in (judged.verdict.why or "")
    assert judged.served_verdict == served.verdict
    text = "\n".join(agent_markdown(judged))
    assert "each checkpoint sampled on the same 400 fixed tasks" in text
    assert text.index("**not passed**") < text.index("### The same on served trajectories") < text.index("**passed**")
    assert "| critical_steps_many_parts | 14.200 (13.000-15.400, n 50) | 14.200 (13.000-15.400, n 50) |" in text


def test_with_nothing_promoted_the_base_alone_is_measured_and_the_verdict_stays() -> None:
    served = build_agent_report("swarm", SPEC, [_swarm_row(1), _swarm_row(3, **LEARNED)], [], 1)
    asked: list[Path] = []

    def measure(folder: Path, tasks: int) -> dict[str, object]:
        asked.append(folder)
        return _swarm_row(0, trajectories=tasks)

    judged = judge_held_out(served, measure, Path("/state"), 16)
    assert [folder.name for folder in asked] == [checkpoint_folder(Path("/state"), 1).name]
    assert [(v.version, v.trajectories) for v in judged.held_out] == [(1, 16)]
    assert judged.verdict == served.verdict
    assert judged.served_verdict is None
    assert "## Held out: 16 fixed tasks per checkpoint" in "\n".join(agent_markdown(judged))


def test_a_held_out_evaluation_that_fails_leaves_the_served_verdict_with_a_warning_saying_why(tmp_path: Path) -> None:
    served = build_agent_report("swarm", SPEC, [_swarm_row(1), _swarm_row(3, **LEARNED)], [3], 1)
    judged = judge_held_out(served, swarm_held_out, tmp_path)  # no learner folder: nothing to load
    assert judged.verdict.passed
    assert judged.served_verdict is None
    assert not judged.held_out
    assert any("held-out evaluation failed" in warning for warning in judged.verdict.warnings)


def test_the_demo_reads_each_version_from_its_learners_folder(tmp_path: Path) -> None:
    name = LearnerSettings().model_name
    assert checkpoint_folder(tmp_path, 1) == tmp_path.resolve() / "learner" / "checkpoints" / checkpoint_id_for(name, 1)
    assert SWARM.held_out is swarm_held_out
