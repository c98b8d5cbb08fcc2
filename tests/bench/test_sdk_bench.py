"""Benchmark: SDK ``emit`` throughput against the raw kafka-python producer sending the same bytes.

Both sides deliver the same events to fresh topics on the same broker, with the same producer
settings (acks=all, idempotence, gzip, 5 ms linger), and are timed from the first call to the last
acknowledgement. The SDK side starts from event models the product built and does everything the
SDK does (privacy check, redaction, serialisation, the journal, the sender); the baseline sends the
pre-serialised bytes of those same events. Runs alternate so that a noisy machine moves both.
Goal: the SDK reaches at least 0.8 of the raw producer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from kafka import KafkaProducer

from infra.stack import Endpoints
from ingest.client import Client
from ingest.events import event_to_json
from ingest.redaction import redact_event
from tests.bench.results import write_result
from tests.ingest.sdk_events import session_events

EVENTS = 20_000
RUNS = 5


def _raw(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, compression_type="gzip",
        linger_ms=5, batch_size=256 * 1024,
    )  # fmt: skip
    try:
        started = time.perf_counter()
        for key, value in records:
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=120)
        return len(records) / (time.perf_counter() - started)
    finally:
        producer.close()


def _sdk(bootstrap: str, topic: str, events: list[object], journal: Path) -> float:
    client = Client(bootstrap=bootstrap, topic=topic, journal_dir=journal)
    try:
        started = time.perf_counter()
        for event in events:
            client.emit(event)  # type: ignore[arg-type]
        assert client.flush(timeout=120)
        return len(events) / (time.perf_counter() - started)
    finally:
        client.close()


def test_sdk_emit_throughput(endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path) -> None:
    events = list(session_events(EVENTS, "bench"))
    records = [(e.session_id.encode(), event_to_json(redact_event(e)[0])) for e in events]
    sdk, raw = [], []
    for run in range(RUNS):
        raw.append(_raw(endpoints.kafka_bootstrap, make_topic(partitions=3), records))
        sdk.append(_sdk(endpoints.kafka_bootstrap, make_topic(partitions=3), events, tmp_path / f"journal-{run}"))
    write_result(
        name="sdk_emit_throughput",
        unit="events/s",
        value=statistics.median(sdk),
        baseline_name="kafka-python KafkaProducer, same pre-serialised bytes",
        baseline_value=statistics.median(raw),
        goal_ratio=0.8,
        runs=RUNS,
        extra={"events_per_run": EVENTS, "sdk_runs": sdk, "baseline_runs": raw},
    )
