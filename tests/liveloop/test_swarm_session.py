"""Swarm sessions through the real gateway and Kafka: what a product running an orchestrator serves and sends.

The orchestrator's decisions are scripted (:class:`~tests.serving.gateway_server.ScriptedEngine`: the real
engine and gateway, the completion text chosen by the test), since what is tested is the product's side of
the trajectory, not what a tiny model writes: serial, parallel and garbled decisions, in a known order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from infra.stack import Endpoints
from liveloop.cli import app
from liveloop.demo.simulator.stats import mean_interval
from liveloop.demo.simulator.summary import SimulationSummary
from liveloop.demo.simulator.swarm import draw_task, task_rng
from liveloop.demo.simulator.swarm_corpus import render_answer
from liveloop.demo.simulator.swarm_session import SwarmRecord, SwarmTally, run_swarm_session
from tests.liveloop.scripted_gateway import Served, scripted_gateway, simulate_env
from tests.serving.gateway_server import read_events

SEED = 3
PLANS = ("serial", "parallel", "garbled", "parallel", "serial", "idle")
"""Session i's decision: its task answered serially, one sub-agent a part, a garbled line, or one sub-agent a
part plus an idle one (fake parallelism)."""


def _script() -> list[str]:
    """What the engine serves, in order: each session's decision, then one token for each of its sub-agents."""
    outputs: list[str] = []
    for index, plan in enumerate(PLANS):
        task = draw_task(task_rng(SEED, index))
        if plan == "garbled":
            outputs.append("<tool_call>{oops")
            continue
        outputs.append(render_answer(task, plan))  # type: ignore[arg-type]
        subagents = 0 if plan == "serial" else task.size + (plan == "idle")
        outputs += ["."] * subagents
    return outputs


@pytest.fixture
def gateway(endpoints: Endpoints, make_topic: Any, tmp_path: Path) -> Iterator[Served]:
    """The gateway serving :func:`_script` as version 1 to a fresh topic, a client for it, and the product's SDK
    on the same topic."""
    with scripted_gateway(endpoints, make_topic, tmp_path, _script()) as served:
        yield served


def test_each_session_serves_its_decision_and_frozen_subagents_and_posts_the_verified_outcome(
    gateway: Served, endpoints: Endpoints
) -> None:
    client, product, topic = gateway.client, gateway.product, gateway.topic
    records = [run_swarm_session(client, product, index, seed=SEED, run_id="test") for index in range(len(PLANS))]
    assert product.flush(timeout=30)
    tasks = [draw_task(task_rng(SEED, index)) for index in range(len(PLANS))]
    assert [record.mode for record in records] == ["serial", "parallel", "garbled", "parallel", "serial", "parallel"]
    # Serial answers give catalog prices; a parallel one succeeds too (a failed sub-agent's part is redone).
    assert [record.success for record in records] == [True, True, False, True, True, True]
    assert [record.parts for record in records] == [task.size for task in tasks]
    assert [record.subagent_turns for record in records] == [0, tasks[1].size, 0, tasks[3].size, 0, tasks[5].size + 1]
    assert [record.fake_parallelism for record in records] == [False] * 5 + [True]
    expected = sum(4 + record.subagent_turns for record in records)  # start, decision, outcome, end, sub-agents
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in read_events(endpoints.kafka_bootstrap, topic, expected):
        by_session[event["session_id"]].append(event)
    assert len(by_session) == len(PLANS)
    for index, record in enumerate(records):
        _check_session(by_session[f"swarm-test-{index}"], record)


def _check_session(events: list[dict[str, Any]], record: SwarmRecord) -> None:
    kinds = [event["type"] for event in events]
    assert [kinds.count(kind) for kind in ("session.started", "trajectory.outcome", "session.ended")] == [1, 1, 1]
    turns = [event["payload"] for event in events if event["type"] == "generation"]
    lead = [turn for turn in turns if turn["turn"]["agent"] == "orchestrator"]
    frozen = [turn for turn in turns if turn["turn"]["agent"] == "subagent"]
    assert len(lead) == 1
    assert len(frozen) == record.subagent_turns
    assert lead[0]["policy_version"] == record.policy_version == 1
    # The product labels the task's kind, so that the learner's baseline is a one-part or a many-part task's.
    assert lead[0]["task_kind"] == ("lookup.single" if record.parts == 1 else "lookup.batch")
    outcome = next(event["payload"] for event in events if event["type"] == "trajectory.outcome")
    trajectory = lead[0]["turn"]["trajectory_id"]
    assert outcome["trajectory_id"] == trajectory
    assert (outcome["success"], outcome["score"]) == (record.success, pytest.approx(record.score))
    assert len(outcome["subagents"]) == record.subagent_turns
    for turn in frozen:  # each sub-agent's turn hangs off the decision, frozen: the distiller never trains it
        place = turn["turn"]
        assert (place["trajectory_id"], place["frozen"]) == (trajectory, True)
        assert place["parent_turn_id"] == lead[0]["generation_id"]
    assert sorted(turn["turn"]["agent_id"] for turn in frozen) == sorted(s["agent_id"] for s in outcome["subagents"])


def test_liveloop_simulate_runs_swarm_sessions_and_sums_them_up_by_version(
    gateway: Served, endpoints: Endpoints, tmp_path: Path
) -> None:
    env = simulate_env(gateway, endpoints, tmp_path)
    # One session at a time: the script's decisions meet their own tasks.
    options = ["--scenario", "swarm", "--seed", str(SEED), "--sessions", str(len(PLANS)), "--concurrency", "1"]
    path = tmp_path / "summary.json"
    args = ["simulate", *options, "--rate", "50", "--gateway", gateway.url, "--summary", str(path)]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert "policy version 1: 6 trajectories, success " in result.output
    summary = SimulationSummary.model_validate_json(path.read_text())
    assert (summary.sessions, summary.sessions_by_profile, summary.request_errors) == (6, {"swarm": 6}, 0)
    assert summary.events == {"session.started": 6, "trajectory.outcome": 6, "session.ended": 6}
    assert summary.requests == len(_script())  # every decision and every sub-agent's turn
    [version] = summary.agents
    assert (version["policy_version"], version["trajectories"]) == (1, 6)
    assert version["garbled"]["rate"] == pytest.approx(1 / 6)
    assert version["fake_parallelism"]["rate"] == pytest.approx(1 / 6)
    assert version["parallel_share_one_part"]["n"] + version["parallel_share_many_parts"]["n"] == 6


def test_the_tally_gives_rates_and_means_with_intervals_by_version() -> None:
    tally = SwarmTally()

    def record(version: int, parts: int, mode: str, steps: int, success: bool = True) -> SwarmRecord:
        parallel = mode == "parallel"
        right = parallel == (parts > 1)
        return SwarmRecord(version, parts, mode, success, 0.5, steps, right, False, False, parts)  # type: ignore[arg-type]

    for steps in (5, 7):
        tally.add(record(1, 1, "serial", steps))
    for steps in (20, 24):
        tally.add(record(1, 4, "serial", steps, success=False))
    tally.add(record(2, 4, "parallel", 9))
    first, second = tally.versions()
    assert (first["policy_version"], first["trajectories"], second["trajectories"]) == (1, 4, 1)
    assert first["success"]["rate"] == 0.5
    assert first["critical_steps_one_part"]["mean"] == 6.0
    assert first["critical_steps_many_parts"]["mean"] == 22.0
    half = 1.959963984540054 * 2.8284271247461903 / 1.4142135623730951  # z * sample std / sqrt(n)
    assert first["critical_steps_many_parts"]["low"] == pytest.approx(22 - half)
    assert first["parallel_share_many_parts"]["rate"] == 0.0
    assert second["parallel_share_one_part"] == {"rate": None, "n": 0, "low": 0.0, "high": 1.0}
    assert second["critical_steps_many_parts"] == {"mean": 9.0, "n": 1, "low": None, "high": None}
    assert mean_interval([]) == (None, None, None)
