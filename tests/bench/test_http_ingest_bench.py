"""Benchmark: events/s through the HTTP ingest API, batches of 100, against the same server's discard endpoint.

The API runs as it does in production: ``python -m ingest.api`` (uvicorn, one worker) on the test
stack's broker, with ``acks=all``, idempotence and gzip. A load generator in this process (threads,
one keep-alive ``httpx`` client each) posts pre-built batches of 100 events for a fixed time and counts
the events the API reported accepted, which it does only after Kafka acknowledged them.

Baseline, measured in the same invocation and interleaved run by run: the same load generator against
``POST /bench/discard`` of the same server, which authenticates and reads the body under the same
limits and then drops it. The ratio shows what validation, redaction and the Kafka round trip cost.
The goal is absolute: at least 20,000 events/s on the 2-core reference machine.

It measures the configuration for a 2-core host: the default settings (gzip included) plus one worker
process that validates and redacts beside the event loop (``LIVELOOP_INGEST_CPU_WORKERS=1``, the
setting's advice: one per core left over). Set ``LIVELOOP_INGEST_CPU_WORKERS=0`` in the environment to
measure everything on the event loop, ``LIVELOOP_INGEST_COMPRESSION=none`` to measure without gzip.

The event mix is a coding assistant's: about a third generations (a 600-character prompt, a
completion, 48 token ids with logprobs; one in fifty carries a secret to redact), the rest feedback.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from kafka import KafkaConsumer, TopicPartition

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from tests.bench.results import write_result
from tests.conftest import free_port
from tests.http_process import http_process

BATCH = 100
BODIES = 200  # distinct pre-built batches, posted round-robin
CLIENTS = 8  # concurrent connections
CPU_WORKERS = os.environ.get("LIVELOOP_INGEST_CPU_WORKERS", "1")
COMPRESSION = os.environ.get("LIVELOOP_INGEST_COMPRESSION", "gzip")
RUN_S = 8.0
RUNS = 3
GOAL_EVENTS_PER_S = 20_000
PROMPT = (
    "def total_price(items: list[Item], discount: float) -> Decimal:\n    # sum the line items, apply the discount\n"
)


def _batch(seed: int) -> bytes:
    """One batch of 100 events over 20 sessions, as JSON bytes."""
    events: list[dict[str, Any]] = []
    for i in range(BATCH):
        session = f"bench-{seed % 50}-{i % 20}"
        generation = str(uuid.uuid5(uuid.NAMESPACE_URL, f"gen/{seed}/{i // 3}"))
        common = {
            "event_id": str(uuid.uuid4()),
            "ts": "2025-01-31T12:00:00.125Z",
            "session_id": session,
            "user_id": f"u{i % 7}",
        }
        if i % 3 == 0:
            prompt = PROMPT * 6 + (f"token = 'ghp_{'x7Kq' * 9}'\n" if i % 50 == 0 else "")
            payload = {
                "generation_id": generation,
                "model": "liveloop-tab",
                "policy_version": 12,
                "prompt": prompt,
                "completion": "    subtotal = sum(item.price * item.quantity for item in items)\n" * 3,
                "completion_token_ids": list(range(1000, 1048)),
                "completion_logprobs": [-0.125] * 48,
                "latency_ms": 38.5,
                "surface": "ide.tab",
                "task_kind": "completion",
            }
            events.append(common | {"type": "generation", "payload": payload})
        elif i % 3 == 1:
            events.append(common | {"type": "suggestion.accepted", "payload": {"generation_id": generation}})
        else:
            edit = {"generation_id": generation, "fraction_remaining": 0.8, "seconds_after": 30.0}
            events.append(common | {"type": "edit.persisted", "payload": edit})
    return json.dumps(events).encode()


def _drive(url: str, key: str, bodies: list[bytes], count_accepted: bool) -> tuple[int, float, int]:
    """Post bodies from CLIENTS threads for RUN_S seconds; (events accepted, seconds, failed requests)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    totals = [0] * CLIENTS
    failures = [0] * CLIENTS
    stop_at = time.perf_counter() + RUN_S

    def client(slot: int) -> None:
        with httpx.Client(timeout=30) as http:
            i = slot
            while time.perf_counter() < stop_at:
                response = http.post(url, content=bodies[i % len(bodies)], headers=headers)
                i += CLIENTS
                if response.status_code != 200:
                    failures[slot] += 1
                    continue
                totals[slot] += response.json()["accepted"] if count_accepted else BATCH

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(totals), time.perf_counter() - started, sum(failures)


@pytest.fixture
def server(endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``python -m ingest.api`` on a free port and fresh topics; yields its url, key, pid and events topic."""
    credentials = tmp_path / "credentials.json"
    key = ensure_credentials(credentials).ingest_keys["default"].get_secret_value()
    port = free_port()
    events_topic = make_topic(partitions=6)
    env = os.environ | {
        "LIVELOOP_INGEST_PORT": str(port),
        "LIVELOOP_INGEST_BOOTSTRAP": endpoints.kafka_bootstrap,
        "LIVELOOP_INGEST_EVENTS_TOPIC": events_topic,
        "LIVELOOP_INGEST_DLQ_TOPIC": make_topic(partitions=1),
        "LIVELOOP_INGEST_CREDENTIALS_PATH": str(credentials),
        "LIVELOOP_INGEST_ENABLE_DISCARD_ENDPOINT": "true",
        "LIVELOOP_INGEST_CPU_WORKERS": CPU_WORKERS,
        "LIVELOOP_INGEST_COMPRESSION": COMPRESSION,
    }
    url = f"http://127.0.0.1:{port}"
    with http_process("ingest.api", env, url, tmp_path / "ingest-api.log") as process:
        yield {"url": url, "key": key, "pid": process.pid, "events_topic": events_topic}


def _cpu_s(process: psutil.Process) -> float:
    """CPU seconds (user + system) of the API process and its worker processes so far."""
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


def _records_on(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return sum(consumer.end_offsets(partitions).values())
    finally:
        consumer.close()


def test_http_ingest_throughput(server: dict[str, Any], endpoints: Endpoints) -> None:
    bodies = [_batch(seed) for seed in range(BODIES)]
    events_url, discard_url = f"{server['url']}/v1/events", f"{server['url']}/bench/discard"
    api_process = psutil.Process(server["pid"])
    warm_up, _, _ = _drive(events_url, server["key"], bodies[:20], count_accepted=True)  # connections, caches
    measured, baseline, cpu_us_per_event, failed, accepted = [], [], [], 0, warm_up
    for _ in range(RUNS):
        cpu_before = _cpu_s(api_process)
        events, seconds, failures = _drive(events_url, server["key"], bodies, count_accepted=True)
        cpu_us_per_event.append((_cpu_s(api_process) - cpu_before) / events * 1e6)
        measured.append(events / seconds)
        accepted += events
        failed += failures
        events, seconds, failures = _drive(discard_url, server["key"], bodies, count_accepted=False)
        baseline.append(events / seconds)
        failed += failures
    value, base = statistics.median(measured), statistics.median(baseline)
    cpu = statistics.median(cpu_us_per_event)
    write_result(
        name="http_ingest_throughput",
        unit="events/s",
        value=value,
        baseline_name="same load generator against POST /bench/discard of the same server (auth + body read)",
        baseline_value=base,
        goal_ratio=None,
        runs=RUNS,
        extra={
            "goal": {"events_per_s_at_least": GOAL_EVENTS_PER_S},
            "batch_events": BATCH,
            "clients": CLIENTS,
            "run_s": RUN_S,
            "runs_events_per_s": measured,
            "runs_baseline_events_per_s": baseline,
            "api_cpu_us_per_event": cpu,
            "cpu_workers": int(CPU_WORKERS),
            "compression": COMPRESSION,
            "failed_requests": failed,
        },
    )
    verdict = "met" if value >= GOAL_EVENTS_PER_S else "missed"
    print(
        f"http ingest: {value:,.0f} events/s (goal >= {GOAL_EVENTS_PER_S:,}: {verdict}), discard {base:,.0f} events/s, "
        f"API CPU {cpu:.0f} us/event, cpu_workers={CPU_WORKERS}, compression={COMPRESSION}, {failed} failed requests"
    )
    assert failed == 0
    # Every accepted event is on the topic (the warm-up's too): accepted means acknowledged by Kafka.
    assert _records_on(endpoints.kafka_bootstrap, server["events_topic"]) >= accepted
