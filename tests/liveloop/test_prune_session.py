"""Prune sessions through the real gateway and Kafka: what a product with a search agent under a context budget
serves and sends.

The model's answers are scripted (:mod:`tests.liveloop.scripted_gateway`): what is tested is the product's side of
the trajectory (a served turn per step, its place and budget, the simulator acting on each answer, the outcome) and
what the distiller makes of it, for a good pruner, one that gives up at once, one that never prunes, and one whose
first answer is garbled, in a known order.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from distill.spec import load_spec
from distill.trajectory import trajectory_samples
from infra.stack import Endpoints
from ingest.events import GenerationEvent, TrajectoryOutcomeEvent, parse_event
from liveloop.cli import app
from liveloop.demo.simulator.prune_corpus import render_answer, right_plan
from liveloop.demo.simulator.prune_session import ACTION, PruneRecord, PruneTally, failed_actions, run_prune_session
from liveloop.demo.simulator.pruning import (
    DEFAULT_SETTINGS,
    SEARCH,
    Episode,
    PruneOutcome,
    draw_task,
    play,
    settle,
    task_rng,
)
from liveloop.demo.simulator.summary import SimulationSummary
from tests.liveloop.scripted_gateway import Served, scripted_gateway, simulate_env
from tests.serving.gateway_server import read_events

SEED = 6
PLANS = ("good", "give_up", "hoard", "garbled")
"""Session i's answers: the right move every turn, ``answer unknown`` at once, ``search`` for ever (past the hard
budget every one is refused), or a garbled first answer and then the right moves."""


def _good(episode: Episode) -> str:
    return render_answer(episode, right_plan(episode))


RESPONDERS: dict[str, Callable[[Episode], str]] = {
    "good": _good,
    "give_up": lambda episode: "answer unknown",
    "hoard": lambda episode: SEARCH,
    "garbled": lambda episode: "hmm" if not episode.turns else _good(episode),
}


def _played(index: int) -> tuple[PruneOutcome, list[str]]:
    """Session ``index`` played offline with its scripted answers: the outcome the product must reach, and the
    answers in the order the engine serves them."""
    answers: list[str] = []
    respond = RESPONDERS[PLANS[index]]

    def recorded(episode: Episode) -> str:
        answers.append(respond(episode))
        return answers[-1]

    return settle(play(draw_task(task_rng(SEED, index)), recorded)), answers


def _script() -> list[str]:
    return [answer for index in range(len(PLANS)) for answer in _played(index)[1]]


@pytest.fixture
def gateway(endpoints: Endpoints, make_topic: Any, tmp_path: Path) -> Iterator[Served]:
    budget = {"budget_soft_tokens": DEFAULT_SETTINGS.soft_bytes, "budget_hard_tokens": DEFAULT_SETTINGS.hard_bytes}
    with scripted_gateway(endpoints, make_topic, tmp_path, _script(), **budget) as served:
        yield served


def test_each_episode_serves_every_turn_and_posts_the_verified_outcome(gateway: Served, endpoints: Endpoints) -> None:
    client, product = gateway.client, gateway.product
    records = [run_prune_session(client, product, index, seed=SEED, run_id="test") for index in range(len(PLANS))]
    assert product.flush(timeout=30)
    expected = [_played(index)[0] for index in range(len(PLANS))]
    assert [record.outcome.episode for record in records] == [outcome.episode for outcome in expected]
    good, give_up, hoard, garbled = (record.outcome for record in records)
    assert good.success_within_budget
    assert (good.prunes, good.give_up) == (2, False)  # seed 6: a chain of several hops, pruned for twice
    assert give_up.give_up
    assert give_up.gave_up
    assert hoard.overran
    assert not hoard.success
    assert (len(hoard.episode.turns), hoard.give_up) == (DEFAULT_SETTINGS.max_turns, False)
    assert garbled.episode.turns[0].decision.kind == "garbled"
    assert garbled.success
    assert [_failed(record) for record in records] == [0, 0, 0, 1]  # only the garbled answer was unreadable
    # start, outcome, end, the served turns, and a failed action per turn the product could not read
    count = sum(3 + record.served_turns + _failed(record) for record in records)
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in read_events(endpoints.kafka_bootstrap, gateway.topic, count):
        by_session[event["session_id"]].append(event)
    assert len(by_session) == len(PLANS)
    for index, record in enumerate(records):
        _check_session(by_session[f"prune-test-{index}"], record, _played(index)[1])


def _failed(record: PruneRecord) -> int:
    return sum(failed_actions(turn.decision) for turn in record.outcome.episode.turns)


def _check_session(events: list[dict[str, Any]], record: PruneRecord, answers: list[str]) -> None:
    kinds = [event["type"] for event in events]
    assert [kinds.count(kind) for kind in ("session.started", "trajectory.outcome", "session.ended")] == [1, 1, 1]
    turns = [event["payload"] for event in events if event["type"] == "generation"]
    assert len(turns) == record.served_turns
    by_parent = {turn["turn"]["parent_turn_id"]: turn for turn in turns}
    chain = [by_parent[None]]
    while chain[-1]["generation_id"] in by_parent:
        chain.append(by_parent[chain[-1]["generation_id"]])
    assert len(chain) == len(turns)
    played = record.outcome.episode.turns
    assert [turn["completion"] for turn in chain] == answers
    # The gateway measured each context itself: the prompt's bytes, against the hard budget it was given.
    assert [turn["turn"]["context_tokens"] for turn in chain] == [t.context_bytes for t in played]
    assert {turn["turn"]["budget_tokens"] for turn in chain} == {DEFAULT_SETTINGS.hard_bytes}
    assert [turn["turn"]["boundary"] for turn in chain] == [t.boundary for t in played]
    assert {turn["turn"]["agent"] for turn in chain} == {"single"}
    assert {turn["policy_version"] for turn in chain} == {record.policy_version} == {1}
    outcome = next(event["payload"] for event in events if event["type"] == "trajectory.outcome")
    assert outcome["trajectory_id"] == chain[0]["turn"]["trajectory_id"]
    assert (outcome["success"], outcome["gave_up"]) == (record.outcome.success, record.outcome.gave_up)
    # What the distiller makes of it: every turn trained on, the prunes counted, each turn over budget an overrun.
    parsed = [parse_event(json.dumps(event)) for event in events]
    generations = [event for event in parsed if isinstance(event, GenerationEvent)]
    final = next(event for event in parsed if isinstance(event, TrajectoryOutcomeEvent))
    credit, samples = trajectory_samples(generations, parsed, final, load_spec())
    assert (credit.trainable_turns, len(samples)) == (len(chain), len(chain))
    assert credit.prunes == record.outcome.prunes
    assert credit.guards["budget_overrun"] == record.outcome.served_over_hard
    assert credit.r_perf == float(record.outcome.success)
    # The garbled turn was reported as a failed action and costs what an invalid tool call costs (give-up's -0.5).
    failed = [event["payload"] for event in events if event["type"] == "tool.result"]
    assert [(result["tool"], result["valid"]) for result in failed] == [(ACTION, False)] * _failed(record)
    assert credit.guards["invalid_tool_call"] == _failed(record)


def test_liveloop_simulate_runs_prune_sessions_and_sums_them_up_by_version(
    gateway: Served, endpoints: Endpoints, tmp_path: Path
) -> None:
    # One session at a time: the script's answers meet their own episodes.
    options = ["--scenario", "prune", "--seed", str(SEED), "--sessions", str(len(PLANS)), "--concurrency", "1"]
    path = tmp_path / "summary.json"
    args = ["simulate", *options, "--rate", "50", "--gateway", gateway.url, "--summary", str(path)]
    result = CliRunner().invoke(app, args, env=simulate_env(gateway, endpoints, tmp_path))
    assert result.exit_code == 0, result.output
    assert "policy version 1: 4 trajectories, success " in result.output
    summary = SimulationSummary.model_validate_json(path.read_text())
    assert (summary.sessions, summary.sessions_by_profile, summary.request_errors) == (4, {"prune": 4}, 0)
    ends = {"session.started": 4, "trajectory.outcome": 4, "session.ended": 4}
    assert summary.events == {**ends, "tool.result": 1}  # the garbled answer, reported as a failed action
    assert summary.requests == len(_script())  # every turn of every episode
    [version] = summary.agents
    tally = PruneTally()
    for index in range(len(PLANS)):
        tally.add(PruneRecord(1, _played(index)[0]))
    assert version == tally.versions()[0]


def test_the_tally_rates_success_within_budget_overruns_give_ups_and_garbled_turns() -> None:
    tally = PruneTally()
    outcomes = [_played(index)[0] for index in range(len(PLANS))]
    for index, outcome in enumerate(outcomes):
        tally.add(PruneRecord(1 + (index == 3), outcome))
    first, second = tally.versions()
    assert list(first) == [
        "policy_version",
        "trajectories",
        "success",
        "success_within_budget",
        "budget_overrun",
        "give_up",
        "garbled",
    ]
    assert (first["trajectories"], second["trajectories"]) == (3, 1)
    assert first["success"]["rate"] == pytest.approx(1 / 3)  # the good pruner only
    assert first["success_within_budget"]["rate"] == pytest.approx(1 / 3)
    assert first["budget_overrun"]["rate"] == pytest.approx(1 / 3)  # the hoarder
    assert first["give_up"]["rate"] == pytest.approx(1 / 3)  # answering "unknown" at once
    assert (first["garbled"]["rate"], first["garbled"]["n"]) == (0.0, sum(len(o.episode.turns) for o in outcomes[:3]))
    assert first["garbled"]["low"] == 0.0
    garbled_turns = len(outcomes[3].episode.turns)
    assert second["garbled"]["rate"] == pytest.approx(1 / garbled_turns)
    assert (second["success"]["rate"], second["success"]["n"], second["success"]["high"]) == (1.0, 1, 1.0)
