"""A Faust table survives a worker restart by recovering from its changelog on the real broker.

What is proven, with real worker processes of ``tests/infra/faust_counter_app.py`` on the local
Apache Kafka broker (no mocks):

1. A worker counts a first batch of keyed messages into a changelog-backed table, exactly.
2. Stopped with SIGTERM, the worker exits on its own and commits its input offsets up to the end of
   the input topic, so a restarted worker has nothing left to re-read there.
3. A new worker with the same app id (the table is in memory, so nothing survives locally) rebuilds
   the table from the changelog topic to exactly the first batch's counts. Because the input offsets
   were committed at the end (2), those counts can only have come from the changelog.
4. After a second batch the table holds first + second exactly: nothing lost, nothing counted twice.

Why it matters: the distiller keeps its session state in Faust tables. A broker that reports wrong end
offsets (the reason the Tansu broker was rejected, see DESIGN.md) ends recovery early with an empty or
partial table, and a worker that re-reads input it already counted double counts rewards. Both would be
silent in production; here they fail this test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.serializer import DefaultSerializer

from infra.stack import Endpoints
from tests.conftest import free_port

MakeTopic = Callable[..., str]  # the `make_topic` fixture: make_topic(partitions=N) -> topic name

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
WAIT_S = 90.0  # for a worker to reach the expected counts (start-up and recovery included)
STABLE_S = 2.0  # the counts must stay right for a few snapshot intervals: late duplicates show up here
STOP_S = 30.0  # for a worker to exit after SIGTERM
LOG_TAIL_CHARS = 4_000

UTF8 = DefaultSerializer()


def _keys(seed: int, count: int, distinct: int) -> list[str]:
    """``count`` keys drawn unevenly from ``distinct`` names, so per-key counts differ from one another."""
    rng = random.Random(seed)
    names = [f"key-{n}" for n in range(distinct)]
    weights = [n + 1 for n in range(distinct)]
    return rng.choices(names, weights=weights, k=count)


def _produce(bootstrap: str, topic: str, keys: Sequence[str]) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        key_serializer=UTF8,
        value_serializer=UTF8,
        client_id="liveloop-test-faust-input",
    )
    try:
        futures = [producer.send(topic, key=key, value=str(i)) for i, key in enumerate(keys)]
        producer.flush(timeout=30)
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close(timeout=10)


def _log_tail(log_path: Path) -> str:
    if not log_path.exists():
        return "(no worker log)"
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return f"--- tail of {log_path.name} ---\n{text[-LOG_TAIL_CHARS:]}"


class CounterWorker:
    """One worker process of the counter app, with its log file."""

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        argv = [sys.executable, "-m", "tests.infra.faust_counter_app", "worker", "--loglevel=warn"]
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def fail(self, message: str) -> NoReturn:
        pytest.fail(f"{message}\n{_log_tail(self.log_path)}")

    def stop(self) -> None:
        """SIGTERM and wait for a clean exit; a worker that hangs is killed and fails the test."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.kill()
            self.fail(f"the worker did not exit within {STOP_S} s of SIGTERM and was killed")

    def kill(self) -> None:
        """Kill the worker's whole session (it may have children) and reap it."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_S)

    def wait_for_counts(self, snapshot: Path, expected: Mapping[str, int]) -> None:
        """Wait until the snapshot equals ``expected`` and stays equal for ``STABLE_S``.

        A count above the expected one fails at once: the table only ever climbs towards the right
        value (counting or replaying its changelog), so more means something was counted twice.
        """
        deadline = time.monotonic() + WAIT_S
        equal_since: float | None = None
        seen: dict[str, int] | None = None
        while True:
            now = time.monotonic()
            if self.process.poll() is not None:
                self.fail(f"the worker exited with {self.process.returncode}; last snapshot: {seen}")
            seen = _read_snapshot(snapshot)
            if seen is not None:
                over = {k: (v, expected.get(k, 0)) for k, v in seen.items() if v > expected.get(k, 0)}
                if over:
                    self.fail(f"counted twice (key: (seen, expected)): {over}")
            if seen == expected:
                equal_since = equal_since if equal_since is not None else now
                if now - equal_since >= STABLE_S:
                    return
            else:
                equal_since = None
            if now > deadline:
                self.fail(f"counts not reached in {WAIT_S} s: expected {dict(expected)}, last seen {seen}")
            time.sleep(0.1)


def _read_snapshot(path: Path) -> dict[str, int] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return {str(k): int(v) for k, v in data.items()}


def _offsets(bootstrap: str, group: str, topic: str) -> tuple[dict[int, int | None], dict[int, int]]:
    """The group's committed offsets on ``topic`` and the topic's end offsets, per partition.

    The consumer only asks; it never joins the group, so it cannot trigger a rebalance.
    """
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed = {tp.partition: consumer.committed(tp) for tp in tps}
        end = {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
        return committed, end
    finally:
        consumer.close(autocommit=False)


@pytest.mark.timeout(300)
def test_table_recovers_from_changelog_after_restart(
    endpoints: Endpoints, make_topic: MakeTopic, tmp_path: Path
) -> None:
    bootstrap = endpoints.kafka_bootstrap
    topic = make_topic(partitions=PARTITIONS)
    app_id = f"test-counter-{uuid.uuid4().hex[:12]}"
    snapshot = tmp_path / "snapshot.json"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "COUNTER_BROKER": bootstrap,
        "COUNTER_TOPIC": topic,
        "COUNTER_APP_ID": app_id,
        "COUNTER_SNAPSHOT": str(snapshot),
        "COUNTER_DATADIR": str(tmp_path / "faust-data"),
    }

    first_keys = _keys(seed=1, count=600, distinct=20)
    second_keys = _keys(seed=2, count=300, distinct=25)  # five keys the table has not seen yet
    first = Counter(first_keys)
    both = first + Counter(second_keys)
    _produce(bootstrap, topic, first_keys)

    workers: list[CounterWorker] = []
    try:
        worker = CounterWorker({**env, "COUNTER_WEB_PORT": str(free_port())}, tmp_path / "worker-1.log")
        workers.append(worker)
        worker.wait_for_counts(snapshot, first)
        worker.stop()
        assert worker.process.returncode == 0, f"worker exited with {worker.process.returncode}"

        # Everything read was committed: the next worker has no input to re-read, so the counts it
        # shows must come from the changelog (one record per update, so at least one per key).
        committed, end = _offsets(bootstrap, app_id, topic)
        assert committed == end, f"input offsets not committed to the end: committed {committed}, end {end}"
        _, changelog_end = _offsets(bootstrap, app_id, f"{app_id}-counts-changelog")
        assert sum(changelog_end.values()) >= len(first), f"changelog too short: {changelog_end}"

        snapshot.unlink()  # only the new worker's view of the table may satisfy the next wait
        worker = CounterWorker({**env, "COUNTER_WEB_PORT": str(free_port())}, tmp_path / "worker-2.log")
        workers.append(worker)
        worker.wait_for_counts(snapshot, first)

        _produce(bootstrap, topic, second_keys)
        worker.wait_for_counts(snapshot, both)
        worker.stop()
        assert worker.process.returncode == 0, f"worker exited with {worker.process.returncode}"
    finally:
        for running in workers:
            running.kill()
