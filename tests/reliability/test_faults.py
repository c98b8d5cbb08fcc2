"""Fault injection under load: crash every component, restart the broker and the database, then account.

While the simulator's users and a steady stream of HTTP-ingested sessions run the whole time, each
component is SIGKILLed once at a random moment (the learner twice: once while it trains, once while it
writes a checkpoint) and Kafka and PostgreSQL are restarted once each. Afterwards the accounting
(:mod:`tests.reliability.accounting`) must find nothing lost, nothing doubled, no sample trained twice
or skipped, no response from a version that was not champion, and a promotion after the last fault;
nothing of a planted secret or a private session may be stored anywhere, and nothing may listen
outside loopback. The report (``reliability-report/faults.json`` and ``.md``) has every figure.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psutil
import psycopg
import pytest

from infra.processes import wait_until
from ingest.client import Client
from ingest.settings import SdkSettings
from learner.settings import LearnerSettings
from liveloop.demo.leak_scan import scan_for_leaks
from liveloop.demo.simulator.runner import Simulation
from tests.conftest import WHOLE_LOOP
from tests.reliability import accounting
from tests.reliability.faults import FaultInjector, learner_activity
from tests.reliability.loop import Loop, drained_consumers, running_loop, simulator_settings
from tests.reliability.profile import ReliabilityProfile
from tests.reliability.report import markdown_table, write_section
from tests.reliability.traffic import HttpSessions, RecordingGateway, RecordingSink

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _listening_outside_loopback(loop: Loop) -> list[str]:
    outside = []
    for name, processes in loop.processes().items():
        for process in processes:
            try:
                sockets = process.net_connections(kind="inet")
            except psutil.Error:
                continue
            for sock in sockets:
                if sock.status == psutil.CONN_LISTEN and sock.laddr.ip not in LOOPBACK:
                    outside.append(f"{name} (pid {process.pid}) listens on {sock.laddr.ip}:{sock.laddr.port}")
    return outside


def _component_exits(loop: Loop, per_component: int = 6) -> dict[str, list[str]]:
    """name -> the last lines of its log that say why it ended: the keeper's exit lines and Faust's crash
    reasons. Kept for the report and for a failed check's message, since the loop's logs go with it."""
    exits: dict[str, list[str]] = {}
    for name in loop.component_names():
        try:
            text = (loop.stack.settings.logs_dir / f"{name}.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        lines = [line.strip()[:300] for line in text.splitlines() if "keeper:" in line or "Crashed reason=" in line]
        if lines:
            exits[name] = lines[-per_component:]
    return exits


@WHOLE_LOOP
@pytest.mark.timeout(3600)
def test_faults_under_load_lose_nothing(tmp_path: Path, reliability: ReliabilityProfile) -> None:
    seed = random.SystemRandom().randrange(10_000)
    rng = random.Random(seed)  # the moments of the faults, repeatable from the reported seed
    # A quarter of the sessions go to the candidate while it is evaluated, so that the canary path is under fire too.
    with running_loop(tmp_path / "loop", extra_env={"LIVELOOP_SERVING_CANARY_FRACTION": "0.25"}) as loop:
        stack = loop.stack
        dsn = stack.endpoints.dsn()
        ingest_key = stack.credentials.ingest_keys["default"].get_secret_value()
        settings = simulator_settings(loop, tmp_path, seed)
        client = Client(
            SdkSettings(
                bootstrap=settings.bootstrap,
                topic=settings.events_topic,
                journal_dir=settings.sdk_journal_dir,
                client_id="reliability-sim",
            )
        )
        sink = RecordingSink(client)
        simulation = Simulation(settings, sink=sink)
        gateway = RecordingGateway(simulation.wiring.gateway)
        simulation.wiring.gateway = gateway  # type: ignore[assignment]
        http = HttpSessions(loop.ingest_url, ingest_key, rate=40.0)

        simulation.start()
        http.start()
        started, traffic_started_at = time.monotonic(), datetime.now(UTC)
        faults = FaultInjector(loop, started)
        traffic_s = reliability.fault_minutes * 60

        def at(fraction: float) -> None:
            """Wait until ``fraction`` of the traffic time (jittered) has passed."""
            target = traffic_s * fraction + rng.uniform(-0.03, 0.03) * traffic_s
            time.sleep(max(0.0, target - (time.monotonic() - started)))

        plan: list[tuple[float, Callable[[], object]]] = [
            (0.10, lambda: faults.kill_component("ingest-api")),
            (0.18, lambda: faults.kill_component("archiver")),
            (0.26, lambda: faults.kill_component("distiller")),
            (0.34, lambda: faults.kill_component("learner", when=learner_activity(loop, "training"), label="training")),
            (0.42, lambda: faults.kill_component("gate")),
            (0.50, lambda: faults.kill_component("gateway")),
            (
                0.58,
                lambda: faults.kill_component(
                    "learner", when=learner_activity(loop, "checkpointing"), label="writing a checkpoint"
                ),
            ),
            (0.72, faults.restart_kafka),
            (0.86, faults.restart_postgres),
        ]
        try:
            for fraction, inject in plan:
                at(fraction)
                inject()
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
        # Sessions end with their last event; give the distiller its flush and the archiver its batch.
        wait_until(lambda: accounting.one_sample_per_generation(dsn).ok, timeout_s=120, interval_s=3)

        accepted = sink.accepted | http.accepted
        checks = [
            accounting.events_exactly_once(dsn, accepted, gateway.served),
            accounting.one_sample_per_generation(dsn),
            accounting.checkpoints_contiguous(
                dsn, stack.endpoints.kafka_bootstrap, stack.topics.samples.name, LearnerSettings()
            ),
            accounting.served_versions_were_champion_or_canary(dsn, gateway.served),
            accounting.promoted_after(dsn, faults_over),
        ]
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT source, count(*) FROM dead_letters GROUP BY source").fetchall()
        letters_by_source = {str(source): int(count) for source, count in rows}
        dead_letters = sum(letters_by_source.values())
        # Each planted malformed event the API judged is one dead letter; one whose post went unanswered
        # (503, timeout, the API killed) may have left one too, and a retried post another.
        planted_dead = http.planted + summary.malformed_dead_lettered
        planted_unsure = http.planted_unanswered + (
            summary.malformed_sent + summary.malformed_skipped - summary.malformed_dead_lettered
        )
        leaks = scan_for_leaks(stack, [s.secret for s in summary.planted_secrets], summary.privacy_session_ids)
        outside = _listening_outside_loopback(loop)
        exits = _component_exits(loop)

    data = {
        "seed": seed,
        "traffic_started_at": traffic_started_at.isoformat(),
        "traffic_s": round(traffic_total_s, 1),
        "faults": [vars(f) for f in faults.faults],
        "checks": {c.name: {"ok": c.ok, **c.figures, "violations": c.violations} for c in checks},
        "simulator": {
            "sessions": summary.sessions,
            "requests": summary.requests,
            "request_errors": summary.request_errors,
            "events": summary.events,
            "sdk_delivered_all": delivered,
        },
        "http_ingest": {
            "accepted_events": len(http.accepted),
            "posts_retried": http.retried_posts,
            "posts_given_up": http.failed_posts,
        },
        "dead_letters": {
            "archived": dead_letters,
            "by_source": letters_by_source,
            "planted": planted_dead,
            "planted_unanswered": planted_unsure,
        },
        "drained": drained,
        "recovered": recovered,
        "leaks": leaks,
        "listening_outside_loopback": outside,
        "component_exits": exits,
    }
    fault_rows = [(f.target, f.kind, f.at_s, f.recovered, f.recovery_s, f.detail) for f in faults.faults]
    check_rows = [(c.name, "yes" if c.ok else "NO", _figures(c.figures)) for c in checks]
    markdown = (
        f"Seed {seed}; {traffic_total_s:.0f} s of traffic; {summary.requests} completions, "
        f"{len(accepted)} accepted events.\n\n"
        + markdown_table(("target", "fault", "at (s)", "recovered", "recovery (s)", "detail"), fault_rows)
        + "\n"
        + markdown_table(("check", "holds", "figures"), check_rows)
        + f"\nDead letters: {dead_letters} archived ({letters_by_source}), {planted_dead} planted and judged, "
        f"{planted_unsure} planted and unanswered. Leaks: {leaks or 'none'}. "
        f"Listening outside loopback: {outside or 'nothing'}.\n"
    )
    write_section(reliability, "faults", data, markdown)

    assert all(f.recovered for f in faults.faults), [vars(f) for f in faults.faults if not f.recovered]
    assert delivered, "the simulator's SDK could not deliver every event after the faults"
    assert http.failed_posts == 0, f"{http.failed_posts} ingest posts never got an answer (last: {http.last_failure})"
    assert drained, "the archiver or the distiller did not catch up after the traffic stopped"
    for check in checks:
        assert check.ok, (
            f"{check.name}: {check.violations} ({check.figures}); traffic from {traffic_started_at:%H:%M:%S}, "
            f"faults at {[(f.target, f.at_s) for f in faults.faults]} s; component exits: {exits}"
        )
    # Only the planted malformed events are rejected, all by the ingest API: none of the real traffic.
    assert set(letters_by_source) <= {"ingest-api"}, f"dead letters from {letters_by_source}"
    assert planted_dead <= dead_letters <= planted_dead + planted_unsure, (
        f"{dead_letters} dead letters archived, {planted_dead} planted and judged, {planted_unsure} unanswered"
    )
    assert leaks == {}, leaks
    assert outside == [], outside
    assert recovered


def _figures(figures: dict[str, object]) -> str:
    return ", ".join(f"{key} {value}" for key, value in figures.items())
