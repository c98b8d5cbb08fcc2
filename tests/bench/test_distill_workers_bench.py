"""Benchmark of the distiller scaled out: one worker against two workers of one app over the same filled topic.

``distill_workers_throughput``: events/s through two ``python -m distill.app`` workers of one consumer
group (each with its own data folder and web port, :meth:`StreamHarness.start_member`) against one
worker, each side on its own fresh topics (6 partitions, the events topic's default) filled with the
same number of sessions of 4 events before any worker starts. Both workers of the two-worker side start
at the same moment; the clock runs from the first sample to the last (broker timestamps), as
``distill_throughput`` times a filled topic, so the group's rebalance when the second worker joins
falls inside the window: it is part of what a second worker costs. Also recorded: the CPU time per
event of the side's worker processes together over that window, how the events split between the two
workers (each worker's ``liveloop_distill_events_total``), and one worker on a one-partition topic, the
most one partition carries (a partition is consumed by one worker at a time, so this is the ceiling of
events/s per partition however many workers run).

On a 2-core machine shared with the broker and the database the ratio shows the overhead of a second
worker, not scaling: two workers compete for the same cores. ``docs/capacity.md`` is generated from
this result (``python -m tests.bench.capacity``). Sides alternate which goes first. Never asserts on
time; it asserts only that every sample arrived and that both workers processed events.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.stack import Endpoints
from tests.bench.results import write_result
from tests.bench.test_distill_bench import (
    Cpu,
    CpuSampler,
    produce,
    sessions_records,
    wait_for_records,
)
from tests.distill.stream_harness import StreamHarness, worker_metrics

PARTITIONS = 6
# 80,000 events per run: at one worker's rate on 6 partitions the window is a few seconds, long enough for the
# CPU sampler and for the rebalance not to be the whole run.
SESSIONS = 20_000
EVENTS_PER_SESSION = 4
RUNS = 3
SAMPLE_WAIT_S = 15.0  # how long a worker's metrics may take to answer after the run
EVENTS_METRIC = "liveloop_distill_events_total"


@dataclass(frozen=True)
class Run:
    """One side's run: its rate, its CPU over the window, and the events each worker processed."""

    events_per_s: float
    cpu: Cpu | None
    per_worker_events: list[float]


def _run(endpoints: Endpoints, dsn: str, workdir: Path, workers: int, partitions: int) -> Run:
    """Fill fresh topics, start ``workers`` workers of one app at once, time them from first to last sample."""
    sessions = sessions_records(SESSIONS, uuid.uuid4().hex[:8])
    records = [record for session in sessions for record in session]
    harness = StreamHarness(
        endpoints.kafka_bootstrap, dsn, workdir, partitions=partitions, tick_interval_s=1.0, name="workers"
    )
    produce(harness.bootstrap, harness.events_topic, records)
    with harness:
        harness.start()
        members = [harness.start_member(f"w{n}") for n in range(1, workers)]
        assert harness.process is not None
        pids = [harness.process.pid, *(member.process.pid for member in members)]
        with CpuSampler(*pids) as cpu:
            out = wait_for_records(
                harness.bootstrap, harness.samples_topic, len(sessions), distinct=True, partitions=partitions
            )
        ports = [harness.web_port, *(member.web_port for member in members)]
        per_worker = [_events_processed(port) for port in ports]
    stamps = sorted(ts / 1000 for _, _, ts in out)
    rate = (len(stamps) - 1) * EVENTS_PER_SESSION / (stamps[-1] - stamps[0])
    return Run(rate, cpu.between(stamps[0], stamps[-1]), per_worker)


def _events_processed(port: int) -> float:
    """A worker's event counter once it answers (0 where it never does: then the assertion below tells)."""
    deadline = time.monotonic() + SAMPLE_WAIT_S
    while time.monotonic() < deadline:
        value = worker_metrics(port).get(EVENTS_METRIC)
        if value is not None:
            return value
        time.sleep(0.2)
    return 0.0


def _cpu(runs: list[Run]) -> dict[str, float] | None:
    timed = [(run.events_per_s, run.cpu) for run in runs if run.cpu is not None]
    if not timed:
        return None
    return {
        "us_per_event": round(statistics.median(cpu.process_cores / rate * 1e6 for rate, cpu in timed), 1),
        "process_cores": round(statistics.median(cpu.process_cores for _, cpu in timed), 2),
        "machine_cores": round(statistics.median(cpu.machine_cores for _, cpu in timed), 2),
    }


# Ten runs of a few tens of seconds each on a busy 2-core machine: more than the suite's 600 s default.
@pytest.mark.timeout(1800)
def test_distill_workers_throughput(endpoints: Endpoints, fresh_database: str, tmp_path: Path) -> None:
    # The warm-up round: the broker's JIT still works on the paths the first run drives (test_distill_bench).
    _run(endpoints, fresh_database, tmp_path / "warm-up", workers=1, partitions=PARTITIONS)
    sides = {
        "one": lambda run: _run(endpoints, fresh_database, tmp_path / f"one{run}", 1, PARTITIONS),
        "two": lambda run: _run(endpoints, fresh_database, tmp_path / f"two{run}", 2, PARTITIONS),
        "one_partition": lambda run: _run(endpoints, fresh_database, tmp_path / f"p{run}", 1, 1),
    }
    runs: dict[str, list[Run]] = {name: [] for name in sides}
    for run in range(RUNS):
        order = list(sides) if run % 2 == 0 else list(reversed(sides))
        for name in order:
            runs[name].append(sides[name](run))
    for measured in runs["two"]:
        assert all(events > 0 for events in measured.per_worker_events), f"a worker idled: {measured}"
    rates = {name: [run.events_per_s for run in measured] for name, measured in runs.items()}
    one, two = statistics.median(rates["one"]), statistics.median(rates["two"])
    write_result(
        name="distill_workers_throughput",
        unit="events/s",
        value=two,
        baseline_name="one distiller worker over the same filled topic (6 partitions)",
        baseline_value=one,
        goal_ratio=None,
        runs=RUNS,
        extra={
            "goal": None,
            "workers": 2,
            "partitions": PARTITIONS,
            "events_per_run": SESSIONS * EVENTS_PER_SESSION,
            "sessions_per_run": SESSIONS,
            "tick_interval_s": 1.0,
            "warm_up_rounds": 1,
            "one_worker_events_per_s": one,
            "two_workers_events_per_s": two,
            "one_worker_one_partition_events_per_s": statistics.median(rates["one_partition"]),
            "one_worker_runs": rates["one"],
            "two_workers_runs": rates["two"],
            "one_partition_runs": rates["one_partition"],
            # Each worker's liveloop_distill_events_total at the end of a run: one worker counts the topic's events
            # once; the two workers' split shows both took a share.
            "one_worker_events_counted": [sum(run.per_worker_events) for run in runs["one"]],
            "two_workers_split": [run.per_worker_events for run in runs["two"]],
            # At least once: records a worker had fetched when the second one joined are read again by their
            # new owner (and deduplicated downstream); this is how many events the two workers counted beyond
            # the topic's, per run.
            "two_workers_reprocessed_events": [
                sum(run.per_worker_events) - SESSIONS * EVENTS_PER_SESSION for run in runs["two"]
            ],
            "cpu": {
                "note": "over each run's window (first to last sample): the side's worker processes' CPU time "
                "(user + system, summed) per event, the cores they kept busy and the cores the whole machine did; "
                "medians of the runs",
                "one": _cpu(runs["one"]),
                "two": _cpu(runs["two"]),
                "one_partition": _cpu(runs["one_partition"]),
            },
        },
    )
