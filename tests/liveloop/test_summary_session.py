"""Summary sessions through the real gateway and Kafka: what a product with a self-summarising agent serves and sends.

The summaries are scripted (:mod:`tests.liveloop.scripted_gateway`): what is tested is the product's side of the
trajectory (the summary turns and the closing turn, their places, the outcome) and what the distiller makes of it,
for summaries that keep every fact, copy the context verbatim, are garbled, or add a fact the user never noted, in a
known order.
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
from liveloop.demo.scenarios import REWARD_SPECS
from liveloop.demo.simulator.summaries import (
    CATALOG,
    SummaryOutcome,
    SummaryRead,
    SummarySettings,
    draw_task,
    play_with,
    task_rng,
)
from liveloop.demo.simulator.summary import SimulationSummary
from liveloop.demo.simulator.summary_corpus import render_summary
from liveloop.demo.simulator.summary_session import (
    SUMMARY_TOOL,
    SummaryRecord,
    SummaryTally,
    run_summary_session,
    summary_check,
    ungrounded_facts,
)
from liveloop.demo.simulator.transport import GatewayClient
from tests.liveloop.scripted_gateway import Served, scripted_gateway, simulate_env
from tests.serving.gateway_server import read_events

SEED = 5
PLANS = ("keep", "verbatim", "keep", "garbled", "invent")
"""Session i's summaries: every one keeps every fact, copies the context verbatim, is unreadable, or keeps every fact
and adds one the user never noted (from the catalog)."""
GARBLED = " hello there"
CLOSING = "."
"""The closing turn's one token."""


def _writer(index: int) -> Callable[[str], str]:
    task = draw_task(task_rng(SEED, index))
    plan = PLANS[index]
    if plan == "garbled":
        return lambda prompt: GARBLED
    if plan == "invent":
        extra = next(key for key in sorted(CATALOG) if task.value(key) is None)
        return lambda prompt: render_summary(prompt, task, "keep") + f" {extra}={CATALOG[extra]}"
    return lambda prompt: render_summary(prompt, task, plan)  # type: ignore[arg-type]


def _expected(index: int) -> SummaryOutcome:
    """Session ``index`` played offline with its scripted summaries: what the product must end up with."""
    return play_with(draw_task(task_rng(SEED, index)), _writer(index))


def _script() -> list[str]:
    """What the engine serves, in order: each session's summaries, then its closing token."""
    outputs: list[str] = []
    for index in range(len(PLANS)):
        outcome = _expected(index)
        assert outcome.summaries, "every drawn session is longer than the trigger"
        outputs += [summary.text for summary in outcome.summaries] + [CLOSING]
    return outputs


@pytest.fixture
def gateway(endpoints: Endpoints, make_topic: Any, tmp_path: Path) -> Iterator[Served]:
    with scripted_gateway(endpoints, make_topic, tmp_path, _script()) as served:
        yield served


def test_each_session_serves_its_summaries_and_a_closing_turn_and_posts_the_verified_outcome(
    gateway: Served, endpoints: Endpoints
) -> None:
    client, product = gateway.client, gateway.product
    records = [run_summary_session(client, product, index, seed=SEED, run_id="test") for index in range(len(PLANS))]
    assert product.flush(timeout=30)
    expected = [_expected(index) for index in range(len(PLANS))]
    assert [record.outcome.answers for record in records] == [outcome.answers for outcome in expected]
    assert [record.served_turns for record in records] == [len(outcome.summaries) + 1 for outcome in expected]
    keep = [records[0], records[2]]
    assert all(record.outcome.success for record in keep)  # every fact kept: every question answered
    assert any(answer.crossed >= 1 for record in keep for answer in record.outcome.answers)
    assert records[1].outcome.verbatim_copy
    assert not records[1].outcome.success  # the copy is cut at the limit: the facts after the cut fall off
    assert not any(summary.verbatim for record in keep for summary in record.outcome.summaries)
    assert all(summary.garbled for summary in records[3].outcome.summaries)
    assert all(len(summary.made_up) == 1 for summary in records[4].outcome.summaries)
    assert [_ungrounded(record) for record in records[:4]] == [0, 0, 0, 0]  # only the invented facts are reported
    # The product's own check: a summary keeping every fact passes on each; one that made a fact up fails on all.
    assert all(summary_check(s) == (len(s.held), 0) for record in keep for s in record.outcome.summaries)
    assert all(summary_check(s) == (0, len(s.held) + 1) for s in records[4].outcome.summaries)
    # start, outcome, end, the served turns, a check per summary that had facts to check, and a failed action per
    # fact a summary wrote that its context did not hold
    count = sum(3 + record.served_turns + _checked(record) + _ungrounded(record) for record in records)
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in read_events(endpoints.kafka_bootstrap, gateway.topic, count):
        by_session[event["session_id"]].append(event)
    assert len(by_session) == len(PLANS)
    for index, record in enumerate(records):
        _check_session(by_session[f"summary-test-{index}"], record)


def _ungrounded(record: SummaryRecord) -> int:
    return sum(len(ungrounded_facts(summary)) for summary in record.outcome.summaries)


def _checked(record: SummaryRecord) -> int:
    return sum(1 for summary in record.outcome.summaries if sum(summary_check(summary)))


def _check_session(events: list[dict[str, Any]], record: SummaryRecord) -> None:
    kinds = [event["type"] for event in events]
    assert [kinds.count(kind) for kind in ("session.started", "trajectory.outcome", "session.ended")] == [1, 1, 1]
    turns = [event["payload"] for event in events if event["type"] == "generation"]
    assert len(turns) == record.served_turns
    # The turns form one chain: the first summary from the session's start, each later turn from the one before.
    by_parent = {turn["turn"]["parent_turn_id"]: turn for turn in turns}
    chain = [by_parent[None]]
    while chain[-1]["generation_id"] in by_parent:
        chain.append(by_parent[chain[-1]["generation_id"]])
    assert len(chain) == len(turns)
    assert [turn["turn"]["boundary"] for turn in chain] == ["none"] + ["summary"] * (len(chain) - 1)
    assert {turn["turn"]["agent"] for turn in chain} == {"single"}
    summaries: tuple[SummaryRead, ...] = record.outcome.summaries
    assert [turn["completion"] for turn in chain] == [summary.text for summary in summaries] + [CLOSING]
    assert [turn["turn"]["context_tokens"] for turn in chain] == [
        *(len(summary.prompt.encode()) for summary in summaries),
        len(record.outcome.final_context.encode()),
    ]
    assert {turn["policy_version"] for turn in chain} == {record.policy_version} == {1}
    outcome = next(event["payload"] for event in events if event["type"] == "trajectory.outcome")
    assert outcome["trajectory_id"] == chain[0]["turn"]["trajectory_id"]
    assert (outcome["success"], outcome["score"]) == (record.outcome.success, pytest.approx(record.outcome.score))
    # What the distiller makes of it: every turn trained on, every summary (the last one too) a summary turn.
    parsed = [parse_event(json.dumps(event)) for event in events]
    generations = [event for event in parsed if isinstance(event, GenerationEvent)]
    final = next(event for event in parsed if isinstance(event, TrajectoryOutcomeEvent))
    credit, samples = trajectory_samples(generations, parsed, final, load_spec())
    assert credit.trainable_turns == len(chain)
    assert credit.r_perf == pytest.approx(record.outcome.score)
    assert [sample.agent.summary_turn for sample in samples if sample.agent] == [True] * len(summaries) + [False]
    # Each invented fact was reported as a failed action of its summary's turn, and costs an invalid tool call.
    failed = [event["payload"] for event in events if event["type"] == "tool.result"]
    assert [(result["tool"], result["valid"]) for result in failed] == [(SUMMARY_TOOL, False)] * _ungrounded(record)
    summary_turns = {turn["generation_id"] for turn in chain[:-1]}
    assert {result["generation_id"] for result in failed} <= summary_turns
    assert credit.guards["invalid_tool_call"] == _ungrounded(record)
    # Each summary's own check (kept facts pass; lost and made-up ones fail) names its turn, and under the summary
    # demo's spec adds its pass share to that turn's reward alone.
    checks = {e["payload"]["generation_id"]: e["payload"] for e in events if e["type"] == "tests.result"}
    expected = {
        turn["generation_id"]: summary_check(summary)
        for turn, summary in zip(chain, summaries, strict=False)
        if sum(summary_check(summary))
    }
    assert {turn: (check["passed"], check["failed"]) for turn, check in checks.items()} == expected
    demo_spec = load_spec(REWARD_SPECS / "summary-demo.yaml")
    demo_credit, demo_samples = trajectory_samples(generations, parsed, final, demo_spec)
    for sample in demo_samples:
        kept, dropped = expected.get(str(sample.generation_id), (0, 0))
        share = kept / (kept + dropped) if kept + dropped else 0.0
        assert sample.reward == pytest.approx(demo_credit.reward + share)
    # The check names each fact a summary wrote, where it wrote it, with its own verdict; under the demo's spec each
    # fact's characters carry +span_check where the context held it with that value and -span_check where it did not.
    for turn, summary in zip(chain, summaries, strict=False):
        spans = checks[turn["generation_id"]].get("spans") if turn["generation_id"] in checks else None
        assert [(span["start"], span["end"], span["passed"]) for span in spans or ()] == list(summary.facts)
        assert all(summary.text[start:end].count("=") == 1 for start, end, _ in summary.facts)
    credited = {
        str(s.generation_id): [(c.start, c.end, c.credit) for c in s.agent.spans] for s in demo_samples if s.agent
    }
    assert credited.pop(chain[-1]["generation_id"]) == []  # the closing turn wrote no summary
    assert demo_spec.agent is not None
    weight = demo_spec.agent.weights.span_check
    assert weight > 0
    assert credited == {
        turn["generation_id"]: [(start, end, weight if right else -weight) for start, end, right in summary.facts]
        for turn, summary in zip(chain, summaries, strict=False)
    }
    if any(summary.made_up for summary in summaries):
        assert min(credit for spans in credited.values() for _, _, credit in spans) == -weight


def test_liveloop_simulate_runs_summary_sessions_and_sums_them_up_by_version(
    gateway: Served, endpoints: Endpoints, tmp_path: Path
) -> None:
    # One session at a time: the script's summaries meet their own sessions.
    options = ["--scenario", "summary", "--seed", str(SEED), "--sessions", str(len(PLANS)), "--concurrency", "1"]
    path = tmp_path / "summary.json"
    args = ["simulate", *options, "--rate", "50", "--gateway", gateway.url, "--summary", str(path)]
    result = CliRunner().invoke(app, args, env=simulate_env(gateway, endpoints, tmp_path))
    assert result.exit_code == 0, result.output
    assert "policy version 1: 5 trajectories, success " in result.output
    summary = SimulationSummary.model_validate_json(path.read_text())
    assert (summary.sessions, summary.sessions_by_profile, summary.request_errors) == (5, {"summary": 5}, 0)
    ends = {"session.started": 5, "trajectory.outcome": 5, "session.ended": 5}
    invented = len(_expected(PLANS.index("invent")).summaries)  # one invented fact a summary
    checks = sum(_checked(SummaryRecord(1, _expected(i), 0)) for i in range(len(PLANS)))
    assert summary.events == {**ends, "tool.result": invented, "tests.result": checks}
    assert summary.requests == len(_script())  # every summary and every closing turn
    [version] = summary.agents
    tally = SummaryTally()
    for index in range(len(PLANS)):
        tally.add(SummaryRecord(1, _expected(index), len(_expected(index).summaries) + 1))
    assert version == tally.versions()[0]
    assert (version["policy_version"], version["trajectories"]) == (1, 5)
    assert version["made_up"]["rate"] == pytest.approx(invented / sum(len(_expected(i).summaries) for i in range(5)))


def test_the_tally_rates_questions_by_crossings_and_summaries_by_hack() -> None:
    tally = SummaryTally()
    records = [SummaryRecord(1 + (index == 3), _expected(index), 0) for index in range(4)]  # all but the invented
    for record in records:
        tally.add(record)
    first, second = tally.versions()
    assert set(first) == {
        "policy_version",
        "trajectories",
        "success",
        "success_crossed_0",
        "success_crossed_1plus",
        "success_decoys",
        "verbatim_copy",
        "made_up",
        "garbled",
    }
    assert (first["policy_version"], first["trajectories"], second["policy_version"]) == (1, 3, 2)
    answers = [answer for record in records[:3] for answer in record.outcome.answers]
    facts = [answer for answer in answers if not answer.decoy]
    crossed = [answer for answer in facts if answer.crossed >= 1]
    assert first["success"]["n"] == len(answers)
    assert first["success_crossed_1plus"]["n"] == len(crossed)
    assert first["success_crossed_0"]["n"] + len(crossed) == len(facts)
    assert first["success_decoys"]["n"] == len(answers) - len(facts)
    # The two honest sessions answer every crossed question; the copy loses some.
    honest = [a for r in (records[0], records[2]) for a in r.outcome.answers if a.crossed >= 1 and not a.decoy]
    copied = [a for a in records[1].outcome.answers if a.crossed >= 1 and not a.decoy]
    assert first["success_crossed_1plus"]["rate"] == pytest.approx(
        (len(honest) + sum(a.correct for a in copied)) / len(crossed)
    )
    assert first["success_crossed_0"]["rate"] in (None, 1.0)  # a question that crossed nothing is always answerable
    copies = len(records[1].outcome.summaries)
    written = sum(len(record.outcome.summaries) for record in records[:3])
    assert first["verbatim_copy"]["rate"] == pytest.approx(copies / written)
    assert first["garbled"]["rate"] == first["made_up"]["rate"] == 0.0  # a copy holds only what the context held
    assert second["garbled"]["rate"] == 1.0
    assert (second["success_crossed_1plus"]["rate"], second["success_crossed_1plus"]["low"]) == (0.0, 0.0)


def test_a_session_too_short_for_a_summary_serves_nothing_and_counts_under_no_version() -> None:
    short = SummarySettings(min_facts=1, max_facts=1, min_filler=0, max_filler=0)
    sent: list[Any] = []

    class Sink:
        def emit(self, event: Any) -> bool:
            sent.append(event)
            return True

    nowhere = GatewayClient("http://127.0.0.1:9/v1", "no-key", "liveloop-policy", timeout_s=1)  # never asked
    record = run_summary_session(nowhere, Sink(), 0, seed=SEED, run_id="test", settings=short)
    assert (record.policy_version, record.served_turns, record.outcome.success) == (None, 0, True)
    assert [event.type for event in sent] == ["session.started", "session.ended"]  # no trajectory, no outcome
    tally = SummaryTally()
    tally.add(record)
    assert tally.versions() == []
