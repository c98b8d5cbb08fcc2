"""Agent trajectories through the real distiller (``python -m distill.app``), the real broker and database.

Trajectories of each reference shape (orchestrator with frozen sub-agents, two summaries, pruned search
over budget) and one-turn trajectories that time out go in through the SDK; the worker is SIGKILLed while
half the trajectories still wait for their outcome (their turns only in its changelog-backed state), and
restarted. Every trainable turn must end up with exactly one sample, byte for byte what the pure code gives.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from pydantic import SecretStr

from distill.replay import replay_from_database
from distill.samples import parse_sample, sample_to_json
from distill.spec import load_spec
from ingest.archiver import Archiver
from ingest.settings import ArchiverSettings
from tests.distill.agent_trajectories import Tree, orchestrator_tree, pruned_search_tree, summary_tree
from tests.distill.stream_harness import MakeHarness

SPEC = load_spec()


def test_agent_trajectories_survive_a_sigkill_mid_trajectory_each_trainable_turn_one_sample(
    make_harness: MakeHarness,
) -> None:
    now = datetime.now(UTC)
    run = uuid.uuid4().int >> 80  # fresh ids per run: sample ids derive from generation ids
    trees: list[Tree] = []
    for index in range(30):
        shape = (orchestrator_tree, summary_tree, pruned_search_tree)[index % 3]
        # Two trajectories per session: a session's state holds several at once.
        tree, _ = shape(seed=(run << 16) | index, session_id=f"agent-{run}-{index // 2}", base=now)
        trees.append(tree)
    timed_out: list[Tree] = []
    for index in range(5):  # an hour old and never finished: final by timeout at the first tick
        tree = Tree(
            seed=(run << 16) | (100 + index), session_id=f"agent-timeout-{run}-{index}", base=now - timedelta(hours=1)
        )
        tree.turn(calls=["search"])
        timed_out.append(tree)
    expected = {parse_sample(raw).sample_id: raw for tree in trees + timed_out for raw in tree.expected(SPEC)}
    held, early = trees[::2], trees[1::2]
    harness = make_harness(name="agent")
    harness.start()
    # Every turn, and the outcomes of half the trajectories; the others are mid-trajectory at the kill.
    harness.emit(
        [event for tree in trees + timed_out for event in tree.events if event["type"] != "trajectory.outcome"]
    )
    harness.emit([tree.events[-1] for tree in early])
    first = sum(len(tree.expected(SPEC)) for tree in early + timed_out)
    harness.wait_for_samples(first, timeout=180)
    harness.kill()
    assert harness.sample_count() < len(expected)
    harness.emit([tree.events[-1] for tree in held])  # while no worker runs
    harness.start()
    harness.wait_ready(timeout=120)
    harness.wait_for_samples(len(expected), timeout=240, stable_s=2.0)

    rows = harness.query("SELECT generation_id, count(*) FROM samples GROUP BY generation_id")
    assert all(count == 1 for _, count in rows)
    stored = {sample.sample_id: sample_to_json(sample) for sample in harness.samples()}
    assert stored == expected
    deduped = {parse_sample(value).sample_id: value for _, value in harness.topic_samples()}
    assert deduped == expected
    finalised = {parse_sample(raw).finalised_by for raw in expected.values()}
    assert finalised == {"outcome", "timeout"}
    assert harness.stop() == 0


def test_replay_of_archived_agent_sessions_matches_the_stream(make_harness: MakeHarness) -> None:
    """Stream one trajectory of each shape, archive the events with the real archiver, and replay them."""
    now = datetime.now(UTC)
    run = uuid.uuid4().int >> 80
    shapes = (orchestrator_tree, summary_tree, pruned_search_tree)
    trees = [shape(seed=(run << 16) | i, session_id=f"replay-{run}-{i}", base=now)[0] for i, shape in enumerate(shapes)]
    events = [event for tree in trees for event in tree.events]
    harness = make_harness(name="agentreplay")
    harness.start()
    harness.emit(events)
    total = sum(len(tree.expected(SPEC)) for tree in trees)
    harness.wait_for_samples(total, timeout=180)
    assert harness.stop() == 0
    settings = ArchiverSettings(
        bootstrap=harness.bootstrap,
        dsn=SecretStr(harness.dsn),
        events_topic=harness.events_topic,
        dlq_topic=harness.dlq_topic,
        group_id=f"{harness.app_id}-archiver",
        batch_max_wait_s=0.2,
    )
    with Archiver(settings) as archiver:
        deadline = time.monotonic() + 60
        while harness.query("SELECT count(*) FROM events")[0][0] < len(events):
            assert time.monotonic() < deadline, "the archiver did not store every event in 60 s"
            archiver.run_once()
    report = replay_from_database(harness.dsn, SPEC)
    assert report.identical, report.summary()
    assert report.replayed == total
