"""A short ``liveloop demo --scenario NAME`` per agent scenario, end to end: real services, every component, the
scenario's simulated sessions, the leak scan and the report (issue 39: "a CI test runs each scenario in a short
form end to end and checks its report's structure and that a candidate was evaluated").

Short form: a base pre-trained for a few steps only (``LIVELOOP_DEMO_PRETRAIN_STEPS``, into a temporary base
cache, so the test never reads a stale base nor fills the user's), two minutes of traffic, and the learner's
cadence compressed (a checkpoint every 30 s once 16 samples trained) so that the gate judges a candidate
within the run. What the base writes after so few steps is mostly garbled; the test asks for the loop's
machinery and the report's shape, not for learning (the lead's acceptance runs are the full demo).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from liveloop.demo.report import DemoReport
from liveloop.demo.scenarios import SCENARIOS
from tests.conftest import WHOLE_LOOP, free_port
from tests.liveloop.test_demo import CHATTER, _liveloop

AGENT_SCENARIOS = [name for name, scenario in SCENARIOS.items() if scenario.report is not None]
PNG = b"\x89PNG\r\n\x1a\n"


@WHOLE_LOOP
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", AGENT_SCENARIOS)
def test_a_short_agent_demo_evaluates_a_candidate_and_reports_by_version(name: str, tmp_path: Path) -> None:
    state, report_dir, cache = tmp_path / "state", tmp_path / "report", tmp_path / "base-cache"
    env = dict(os.environ, LIVELOOP_INFRA_STATE_DIR=str(state))
    for port in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "POSTGRES_PORT", "MLFLOW_PORT"):
        env[f"LIVELOOP_INFRA_{port}"] = str(free_port())
    for port in ("INGEST_PORT", "DISTILL_WEB_PORT", "LEARNER_STATUS_PORT", "SERVING_PORT", "DASHBOARD_PORT"):
        env[f"LIVELOOP_{port}"] = str(free_port())
    env.update(
        LIVELOOP_DEMO_PRETRAIN_STEPS="40",
        LIVELOOP_DEMO_BASE_CACHE_DIR=str(cache),
        LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S="30",
        LIVELOOP_LEARNER_MIN_SAMPLES="16",
        LIVELOOP_LEARNER_ROUND_SAMPLES="16",
        LIVELOOP_SIMULATOR_DRAIN_S="20",
        LIVELOOP_DEMO_HELD_OUT_TASKS="16",
    )
    args = ["demo", "--scenario", name, "--minutes", "2", "--seed", "3", "--report", str(report_dir)]
    try:
        run = _liveloop([*args, "--state-dir", str(state)], env, timeout=1300)
    finally:
        _liveloop(["down", "--purge"], env, timeout=300)
    console = run.stdout + run.stderr
    assert run.returncode == 0, console[-6000:]
    for chatter in CHATTER:
        assert chatter not in console, f"{chatter!r} on the console:\n{console[-4000:]}"
    assert "pre-trained now" in console  # a fresh cache: this demo pre-trained its base, and cached it
    assert [path.name.startswith(f"{name}-") for path in cache.iterdir()] == [True]

    report = DemoReport.model_validate_json((report_dir / "report.json").read_text())
    assert (report.scenario, report.seed, report.minutes, report.base_version) == (name, 3, 2.0, 1)
    assert report.gate_decisions, "the gate evaluated no candidate"
    for decision in report.gate_decisions:  # the agent demos' gate policy compares each candidate with the base
        assert any(str(reason).split(" ", 2)[1:2] == ["guard"] for reason in decision.reasons), decision.reasons
        assert any(" vs base " in reason and "drop" in reason for reason in decision.reasons), decision.reasons
    assert report.checkpoints, "the learner wrote no checkpoint"
    assert report.leaks.found == {}, report.leaks  # the leak scan ran after the scenario, as after the code demo
    agents = report.agents
    assert agents is not None
    spec = SCENARIOS[name].report
    assert spec is not None
    assert [f.key for f in agents.figures] == list(spec.figures())
    assert agents.versions, "the simulator recorded no trajectory"
    base = {v.version: v for v in agents.versions}.get(report.base_version)
    assert base is not None, agents.versions
    assert base.trajectories > 0
    # Every figure of the base, with its 95 % interval where anything was measured.
    success = base.figures[spec.success]
    # Swarm and prune count success per trajectory; summary per question asked (several per session).
    assert success.n == base.trajectories if name != "summary" else success.n >= base.trajectories
    assert None not in (success.value, success.low, success.high), success
    assert success.low <= success.value <= success.high  # type: ignore[operator]
    # Every figure the scenario's report spec names, the simulator's tally reports (a misnamed key would be
    # left out of the report silently).
    assert set(base.figures) == set(spec.figures()), sorted(base.figures)
    verdict = agents.verdict
    assert verdict.base_version == report.base_version
    assert report.verdict.improved == verdict.passed
    if verdict.judged_version is not None:
        assert {c.figure for c in verdict.criteria} >= {spec.success, *spec.hacks, *spec.guards}
    if SCENARIOS[name].held_out is not None:
        # The base, and the judged checkpoint if any, each answered the same held-out tasks.
        assert agents.held_out_tasks == 16
        measured = [report.base_version] + ([] if verdict.judged_version is None else [verdict.judged_version])
        assert [(v.version, v.trajectories) for v in agents.held_out] == [(version, 16) for version in measured]
        assert set(agents.held_out[0].figures) == set(spec.figures())
        assert (agents.served_verdict is None) == (verdict.judged_version is None)

    markdown = (report_dir / "report.md").read_text()
    assert markdown.startswith(f"# liveloop demo: scenario `{name}`")
    for section in ("## Verdict", "## Figures by policy version", f"### {spec.success} (success", "## Gate decisions"):
        assert section in markdown, markdown[:3000]
    if SCENARIOS[name].held_out is not None:
        assert "## Held out: 16 fixed tasks per checkpoint" in markdown
    assert (report_dir / "figures.png").read_bytes()[:8] == PNG
