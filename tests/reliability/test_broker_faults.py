"""Brokers killed under load on a three-broker Kafka: nothing lost, nothing doubled, the loop keeps promoting.

The whole loop runs on a local cluster of three brokers (``kafka_brokers=3``: every topic with three
replicas, ``min.insync.replicas=2``, every producer ``acks=all`` and idempotent). While the simulator's
users and a steady stream of HTTP-ingested sessions run, broker 1 (the first bootstrap address) is
SIGKILLed, brought back, and once it is registered again with every replica in sync and events flow,
broker 2 likewise. Afterwards every accepted event must be archived exactly once, every generation be
exactly one sample, and a checkpoint be promoted after the last fault. The report section
``broker_faults`` has every figure. ``LIVELOOP_RELIABILITY_BROKER_FAULT_MINUTES`` sets the traffic's length
(4 minutes in CI, 8 in ``make reliability``).
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infra.processes import wait_until
from ingest.client import Client
from ingest.settings import SdkSettings
from liveloop.demo.simulator.runner import Simulation
from tests.reliability import accounting
from tests.reliability.faults import FaultInjector
from tests.reliability.loop import drained_consumers, running_loop, simulator_settings
from tests.reliability.profile import ReliabilityProfile
from tests.reliability.report import markdown_table, write_section
from tests.reliability.traffic import HttpSessions, RecordingGateway, RecordingSink


@pytest.mark.skipif(
    not ReliabilityProfile().full,
    reason="a whole loop of its own for 10-15 minutes: make reliability runs it (LIVELOOP_RELIABILITY_FULL=1); "
    "make test would pass its 45 minutes with it",
)
@pytest.mark.timeout(3600)
def test_brokers_killed_one_after_another_lose_nothing(tmp_path: Path, reliability: ReliabilityProfile) -> None:
    seed = random.SystemRandom().randrange(10_000)
    rng = random.Random(seed)
    with running_loop(tmp_path / "loop", brokers=3) as loop:
        stack = loop.stack
        assert stack.replication.factor == 3
        assert stack.replication.min_insync == 2
        dsn = stack.endpoints.dsn()
        ingest_key = stack.credentials.ingest_keys["default"].get_secret_value()
        settings = simulator_settings(loop, tmp_path, seed)
        client = Client(
            SdkSettings(
                bootstrap=settings.bootstrap,
                topic=settings.events_topic,
                journal_dir=settings.sdk_journal_dir,
                client_id="reliability-brokers",
            )
        )
        sink = RecordingSink(client)
        simulation = Simulation(settings, sink=sink)
        gateway = RecordingGateway(simulation.wiring.gateway)
        simulation.wiring.gateway = gateway  # type: ignore[assignment]
        http = HttpSessions(loop.ingest_url, ingest_key, rate=40.0)
        topics = [spec.name for spec in stack.topics.all()]

        simulation.start()
        http.start()
        started = time.monotonic()
        faults = FaultInjector(loop, started)
        traffic_s = reliability.broker_fault_minutes * 60

        def at(fraction: float) -> None:
            target = traffic_s * fraction + rng.uniform(-0.03, 0.03) * traffic_s
            time.sleep(max(0.0, target - (time.monotonic() - started)))

        try:
            at(0.2)
            faults.kill_broker(1, topics)  # returns once it is back: in sync, and events archived again
            at(0.5)
            faults.kill_broker(2, topics)
            faults_over = datetime.now(UTC)
            at(1.0)
            recovered = wait_until(lambda: accounting.promoted_after(dsn, faults_over).ok, timeout_s=420, interval_s=5)
        finally:
            simulation.stop()
            http.stop()
            summary = simulation.finish()
            delivered = client.close(timeout=120)
        traffic_total_s = time.monotonic() - started
        drained = wait_until(lambda: drained_consumers(loop), timeout_s=300, interval_s=2)
        wait_until(lambda: accounting.one_sample_per_generation(dsn).ok, timeout_s=120, interval_s=3)

        accepted = sink.accepted | http.accepted
        checks = [
            accounting.events_exactly_once(dsn, accepted, gateway.served),
            accounting.one_sample_per_generation(dsn),
            accounting.promoted_after(dsn, faults_over),
        ]

    data = {
        "seed": seed,
        "brokers": 3,
        "traffic_s": round(traffic_total_s, 1),
        "faults": [vars(f) for f in faults.faults],
        "checks": {c.name: {"ok": c.ok, **c.figures, "violations": c.violations} for c in checks},
        "simulator": {"sessions": summary.sessions, "requests": summary.requests, "events": summary.events},
        "http_ingest": {"accepted_events": len(http.accepted), "posts_given_up": http.failed_posts},
        "sdk_delivered_all": delivered,
        "drained": drained,
        "recovered": recovered,
    }
    fault_rows = [(f.target, f.kind, f.at_s, f.recovered, f.recovery_s, f.detail) for f in faults.faults]
    check_rows = [
        (c.name, "yes" if c.ok else "NO", ", ".join(f"{k} {v}" for k, v in c.figures.items())) for c in checks
    ]
    markdown = (
        f"Three brokers, seed {seed}; {traffic_total_s:.0f} s of traffic; {len(accepted)} accepted events.\n\n"
        + markdown_table(("target", "fault", "at (s)", "recovered", "recovery (s)", "detail"), fault_rows)
        + "\n"
        + markdown_table(("check", "holds", "figures"), check_rows)
    )
    write_section(reliability, "broker_faults", data, markdown)

    assert all(f.recovered for f in faults.faults), [vars(f) for f in faults.faults if not f.recovered]
    assert delivered, "the simulator's SDK could not deliver every event after the faults"
    assert http.failed_posts == 0, f"{http.failed_posts} ingest posts never got an answer (last: {http.last_failure})"
    assert drained, "the archiver or the distiller did not catch up after the traffic stopped"
    for check in checks:
        assert check.ok, f"{check.name}: {check.violations} ({check.figures}); faults {data['faults']}"
    assert recovered
