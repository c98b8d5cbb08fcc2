"""Benchmark of trajectory assembly: distiller events/s on agent traffic vs its own single-turn throughput.

Both sides are the same real distiller (``python -m distill.app``, default settings, ticks every second) on
a topic filled before it starts, over the same number of events, timed as ``test_distill_bench.py`` times
its filled runs (first to last sample on the samples topic, by broker time: start-up and recovery come
before the first). Agent traffic is the reference trees of ``tests/distill/agent_trajectories.py`` in
turn, each tool call followed by its ``tool.result`` as a product reports them (an orchestrator with five
frozen sub-agents: 36 events and 4 samples; two summaries: 8 and 5; a pruned search over budget: 12 and
5), one trajectory per session: a quarter of a sample per event, as single-turn traffic (sessions of four
events: start, generation, accept, end) has. Runs alternate. Goal: agent throughput at least 0.7 of
single-turn.

Never asserts on time; it asserts only that every sample arrived.
"""

from __future__ import annotations

import statistics
import uuid
from datetime import UTC, datetime
from pathlib import Path

from distill.samples import parse_sample
from distill.spec import load_spec
from infra.stack import Endpoints
from tests.bench.results import write_result
from tests.bench.test_distill_bench import (
    PARTITIONS,
    CpuSampler,
    Throughput,
    _filled_throughput,
    produce,
    sessions_records,
    wait_for_records,
)
from tests.distill.agent_trajectories import orchestrator_tree, pruned_search_tree, summary_tree
from tests.distill.stream_harness import StreamHarness, dump_json

EVENTS_PER_RUN = 12_000
RUNS = 3
SHAPES = (orchestrator_tree, summary_tree, pruned_search_tree)


def agent_records(events: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """Trajectories of the reference shapes, timestamped now, until ``events`` events; and their sample count."""
    now = datetime.now(UTC)
    spec = load_spec()
    run = uuid.uuid4().int >> 88  # 40 bits: with the index, a seed below 2**64 (Tree)
    records: list[tuple[bytes, bytes]] = []
    samples = 0
    index = 0
    while len(records) < events:
        session = f"agent-bench-{run}-{index}"
        tree, _ = SHAPES[index % len(SHAPES)](
            seed=(run << 20) | index, session_id=session, user_id=f"user-{index % 500}", base=now, tool_results=True
        )
        records += [(session.encode(), dump_json(event)) for event in tree.events]
        samples += len(tree.expected(spec))
        index += 1
    return records, samples


def _throughput(endpoints: Endpoints, dsn: str, workdir: Path, agent: bool) -> Throughput:
    """Events/s of one distiller over a filled topic of agent or single-turn traffic."""
    if agent:
        records, samples = agent_records(EVENTS_PER_RUN)
    else:
        sessions = sessions_records(EVENTS_PER_RUN // 4, uuid.uuid4().hex[:8])
        records, samples = [record for session in sessions for record in session], len(sessions)
    harness = StreamHarness(endpoints.kafka_bootstrap, dsn, workdir, partitions=PARTITIONS, tick_interval_s=1.0)
    produce(harness.bootstrap, harness.events_topic, records)
    with harness:
        harness.start()
        assert harness.process is not None
        with CpuSampler(harness.process.pid) as cpu:
            out = wait_for_records(harness.bootstrap, harness.samples_topic, samples, distinct=True)
    assert len({parse_sample(value).sample_id for _, value, _ in out}) == samples
    return _filled_throughput(out, len(records) / samples, cpu)


def test_agent_distill_throughput(endpoints: Endpoints, fresh_database: str, tmp_path: Path) -> None:
    _throughput(endpoints, fresh_database, tmp_path / "warm-up", agent=True)  # see test_distill_bench's warm-up
    rates: dict[bool, list[float]] = {True: [], False: []}
    for run in range(RUNS):
        order = (True, False) if run % 2 == 0 else (False, True)
        for agent in order:
            rates[agent].append(_throughput(endpoints, fresh_database, tmp_path / f"{run}-{agent}", agent).events_per_s)
    write_result(
        name="distill_agent_throughput",
        unit="events/s",
        value=statistics.median(rates[True]),
        baseline_name="the same distiller on single-turn sessions (start, generation, accept, end), same event count",
        baseline_value=statistics.median(rates[False]),
        goal_ratio=0.7,
        runs=RUNS,
        extra={
            "events_per_run": EVENTS_PER_RUN,
            "partitions": PARTITIONS,
            "agent_runs": rates[True],
            "single_turn_runs": rates[False],
            "agent_traffic": "orchestrator (36 events, 4 samples), two summaries (8, 5), pruned search (12, 5), "
            "in turn; every tool call with its tool.result",
        },
    )
