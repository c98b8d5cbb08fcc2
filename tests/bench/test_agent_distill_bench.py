"""Benchmark of trajectory assembly: distiller events/s on agent traffic vs its own single-turn throughput.

Both sides are the same real distiller (``python -m distill.app``, default settings, ticks every second) on
a topic filled before it starts, over the same number of events, timed as ``test_distill_bench.py`` times
its filled runs (first to last sample on the samples topic, by broker time: start-up and recovery come
before the first). Agent traffic is the reference trees of ``tests/distill/agent_trajectories.py`` in
turn, each tool call followed by its ``tool.result`` as a product reports them (an orchestrator with five
frozen sub-agents: 36 events and 4 samples; two summaries: 8 and 5; a pruned search over budget: 12 and
5), one trajectory per session: a quarter of a sample per event, as single-turn traffic (sessions of four
events: start, generation, accept, end) has. Runs alternate. Goal: agent throughput at least 0.7 of
single-turn. Also recorded (``dense``): the same trajectories without tool results, half a sample per event.
What bounds the distiller is per-session work (each session's state is read and written once per batch)
and per-sample work (scoring, the scored hop, admission, the audit store): agent traffic has more events per
session, and, without tool results, more samples per event.

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


def agent_records(events: int, tool_results: bool = True) -> tuple[list[tuple[bytes, bytes]], int]:
    """Trajectories of the reference shapes, timestamped now, until ``events`` events; and their sample count."""
    now = datetime.now(UTC)
    spec = load_spec()
    run = uuid.uuid4().int >> 88  # 40 bits: with the index, a seed below 2**64 (Tree)
    records: list[tuple[bytes, bytes]] = []
    samples = 0
    index = 0
    while len(records) < events:
        session = f"agent-bench-{run}-{index}"
        user = f"user-{index % 500}"
        shape = SHAPES[index % len(SHAPES)]
        tree, _ = shape(seed=(run << 20) | index, session_id=session, user_id=user, base=now, tool_results=tool_results)
        records += [(session.encode(), dump_json(event)) for event in tree.events]
        samples += len(tree.expected(spec))
        index += 1
    return records, samples


def _throughput(endpoints: Endpoints, dsn: str, workdir: Path, kind: str) -> Throughput:
    """Events/s of one distiller over a filled topic of agent (``agent``, or ``dense``: without the tool
    results) or single-turn (``single``) traffic."""
    if kind != "single":
        records, samples = agent_records(EVENTS_PER_RUN, tool_results=kind == "agent")
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
    _throughput(endpoints, fresh_database, tmp_path / "warm-up", "agent")  # see test_distill_bench's warm-up
    rates: dict[str, list[float]] = {"agent": [], "dense": [], "single": []}
    for run in range(RUNS):
        order = list(rates) if run % 2 == 0 else list(reversed(rates))
        for kind in order:
            rates[kind].append(_throughput(endpoints, fresh_database, tmp_path / f"{run}-{kind}", kind).events_per_s)
    write_result(
        name="distill_agent_throughput",
        unit="events/s",
        value=statistics.median(rates["agent"]),
        baseline_name="the same distiller on single-turn sessions (start, generation, accept, end), same event count",
        baseline_value=statistics.median(rates["single"]),
        goal_ratio=0.7,
        runs=RUNS,
        extra={
            "events_per_run": EVENTS_PER_RUN,
            "partitions": PARTITIONS,
            "agent_runs": rates["agent"],
            "single_turn_runs": rates["single"],
            "dense": {
                "note": "the same trajectories without their tool results: about half a sample per event, twice the "
                "single-turn share, so per-sample work (scoring, the scored hop, admission, the audit store) weighs",
                "ratio": statistics.median(rates["dense"]) / statistics.median(rates["single"]),
                "events_per_s": statistics.median(rates["dense"]),
                "runs": rates["dense"],
            },
            "agent_traffic": "orchestrator (36 events, 4 samples), two summaries (8, 5), pruned search (12, 5), "
            "in turn; every tool call with its tool.result",
        },
    )
