"""Run the real distiller (``python -m distill.app``) as a worker process against the test stack.

A :class:`StreamHarness` owns everything one test's distiller needs, fresh: a Faust app id (so a new
consumer group and new changelog topics), an events topic with ``partitions`` partitions, a samples
topic and a dead-letter topic, a migrated database, a free web port, a data folder and, optionally, a
reward spec file. ``start``/``stop``/``kill`` drive the worker; ``emit`` sends events through the SDK
(``produce_raw`` goes around it, for what the SDK refuses to send, such as privacy-mode events); the
query helpers read what the worker wrote to PostgreSQL and to the samples topic. Every wait fails the
test with the tail of the worker's log, so a failure says what the worker was doing.

Event builders (:func:`envelope`, :func:`generation`, :func:`feedback`, ...) make valid event dicts
with fresh ids; a test passes the ids and times it wants to control.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, NoReturn

import psycopg
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pydantic import SecretStr

from distill.app import internal_topics
from distill.replay import stored_sample
from distill.samples import Sample, parse_sample
from distill.settings import DistillSettings
from distill.spec import RewardSpec, load_spec
from infra.lag import consumer_lag
from infra.migrations import migrate
from infra.settings import TopicSpec
from infra.topics import ensure_topics
from ingest.client import Client
from tests.conftest import free_port

yaml: Any = importlib.import_module("yaml")  # untyped; see distill/spec.py

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SPEC_PATH = REPO_ROOT / "distill" / "specs" / "default.yaml"
LOG_TAIL_CHARS = 6_000
STOP_S = 30.0
# Faust's defaults keep a SIGKILLed member in the group for 60 s, which a restarted worker would wait
# out in its first rebalance. Faust reads these from the environment; the broker's minimum is 6 s.
FAUST_ENV = {"BROKER_SESSION_TIMEOUT": "8", "BROKER_HEARTBEAT_INTERVAL": "1"}

Json = dict[str, Any]
MakeHarness = Callable[..., "StreamHarness"]
"""The ``make_harness`` fixture (tests/distill/conftest.py): ``make_harness(**options)`` gives a harness."""


def iso(ts: datetime) -> str:
    """An event timestamp as the contract writes it (UTC, ``Z``)."""
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


def spec_document(**updates: Any) -> Json:
    """The packaged default spec as a dict, with top-level fields replaced and mappings merged one level deep.

    ``spec_document(windows_s={"rating": 6})`` changes one window and keeps the others.
    """
    document: Json = yaml.safe_load(DEFAULT_SPEC_PATH.read_text(encoding="utf-8"))
    for key, value in updates.items():
        if isinstance(value, Mapping) and isinstance(document.get(key), dict):
            document[key] = {**document[key], **value}
        else:
            document[key] = copy.deepcopy(value)
    return document


# -- events ------------------------------------------------------------------------------------------


def envelope(kind: str, session_id: str, payload: Json, *, ts: datetime, user_id: str = "user-1", **extra: Any) -> Json:
    """One event as a dict, with a fresh event id unless ``event_id`` is given."""
    return {
        "event_id": str(extra.pop("event_id", uuid.uuid4())),
        "type": kind,
        "ts": iso(ts),
        "session_id": session_id,
        "user_id": user_id,
        "tenant": extra.pop("tenant", "acme"),
        "payload": payload,
        **extra,
    }


def started(session_id: str, *, ts: datetime, user_id: str = "user-1", **extra: Any) -> Json:
    """A ``session.started`` event."""
    payload = {"surface": "ide.tab", "client": "liveloop-stream-test"}
    return envelope("session.started", session_id, payload, ts=ts, user_id=user_id, **extra)


def generation(
    session_id: str, generation_id: uuid.UUID | str, *, ts: datetime, user_id: str = "user-1", **payload: Any
) -> Json:
    """A ``generation`` event with a small completion, its token ids and logprobs; ``payload`` overrides."""
    extra = {k: payload.pop(k) for k in ("event_id", "tenant", "privacy_mode") if k in payload}
    body = {
        "generation_id": str(generation_id),
        "model": "liveloop-tiny",
        "policy_version": 3,
        "prompt": "def add(a, b):\n",
        "completion": "    return a + b\n",
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "completion_logprobs": [-0.5, -0.25],
        "surface": "ide.tab",
        "task_kind": "completion",
        **payload,
    }
    return envelope("generation", session_id, body, ts=ts, user_id=user_id, **extra)


def feedback(
    kind: str, session_id: str, generation_id: uuid.UUID | str, *, ts: datetime, user_id: str = "user-1", **payload: Any
) -> Json:
    """A feedback event (``suggestion.accepted``, ``rating``, ...) about ``generation_id``."""
    extra = {k: payload.pop(k) for k in ("event_id", "tenant", "privacy_mode") if k in payload}
    body = {"generation_id": str(generation_id), **payload}
    return envelope(kind, session_id, body, ts=ts, user_id=user_id, **extra)


def ended(session_id: str, *, ts: datetime, user_id: str = "user-1", **extra: Any) -> Json:
    """A ``session.ended`` event."""
    return envelope("session.ended", session_id, {"reason": "closed"}, ts=ts, user_id=user_id, **extra)


def simple_session(session_id: str, generation_id: uuid.UUID | str, *, ts: datetime, user_id: str) -> list[Json]:
    """Start, one generation, an accept, end: the session shape of the load tests (reward 0.75)."""
    return [
        started(session_id, ts=ts, user_id=user_id),
        generation(session_id, generation_id, ts=ts, user_id=user_id),
        feedback("suggestion.accepted", session_id, generation_id, ts=ts, user_id=user_id),
        ended(session_id, ts=ts, user_id=user_id),
    ]


# -- the harness -------------------------------------------------------------------------------------


class StreamHarness:
    """One distiller worker process with fresh topics, database, app id, port and data folder.

    ``dsn`` names a database (the ``fresh_database`` fixture); it is migrated here (idempotent).
    ``spec`` is a spec document (see :func:`spec_document`) written to a YAML file, or ``None`` for
    the packaged default. Use it as a context manager: leaving it kills a worker still running.
    """

    def __init__(
        self,
        bootstrap: str,
        dsn: str,
        workdir: Path,
        *,
        partitions: int = 3,
        spec: Mapping[str, Any] | None = None,
        tick_interval_s: float = 0.5,
        orphan_grace_s: float = 60.0,
        name: str = "stream",
    ) -> None:
        self.bootstrap = bootstrap
        self.dsn = dsn
        self.workdir = workdir
        self.partitions = partitions
        tag = uuid.uuid4().hex[:10]
        self.app_id = f"test-distill-{name}-{tag}"
        self.events_topic = f"test.{name}.events.{tag}"
        self.samples_topic = f"test.{name}.samples.{tag}"
        self.dlq_topic = f"test.{name}.dlq.{tag}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.spec_path: Path | None = None
        if spec is not None:
            self.spec_path = workdir / f"spec-{tag}.yaml"
            self.spec_path.write_text(yaml.safe_dump(dict(spec), sort_keys=False), encoding="utf-8")
        self.spec: RewardSpec = load_spec(self.spec_path)
        self.web_port = free_port()
        self.settings = DistillSettings(
            bootstrap=bootstrap,
            dsn=SecretStr(dsn),
            events_topic=self.events_topic,
            samples_topic=self.samples_topic,
            dlq_topic=self.dlq_topic,
            app_id=self.app_id,
            partitions=partitions,
            store="rocksdb",
            data_dir=workdir / f"faust-{tag}",
            web_port=self.web_port,
            tick_interval_s=tick_interval_s,
            orphan_grace_s=orphan_grace_s,
            spec_path=self.spec_path,
        )
        topics = [
            TopicSpec(name=self.events_topic, partitions=partitions),
            TopicSpec(name=self.samples_topic, partitions=partitions),
            TopicSpec(name=self.dlq_topic, partitions=1),
            *internal_topics(self.settings),
        ]
        ensure_topics(bootstrap, topics)
        migrate(dsn)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_path = workdir / f"worker-{tag}.log"
        self._client: Client | None = None
        self._producer: Any = None
        self._members: list[Member] = []

    # -- lifecycle -------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The worker's environment: the settings as ``LIVELOOP_DISTILL_*`` variables."""
        s = self.settings
        values = {
            "BOOTSTRAP": s.bootstrap,
            "DSN": self.dsn,
            "EVENTS_TOPIC": s.events_topic,
            "SAMPLES_TOPIC": s.samples_topic,
            "DLQ_TOPIC": s.dlq_topic,
            "APP_ID": s.app_id,
            "PARTITIONS": str(s.partitions),
            "STORE": s.store,
            "DATA_DIR": str(s.data_dir),
            "WEB_PORT": str(s.web_port),
            "TICK_INTERVAL_S": str(s.tick_interval_s),
            "ORPHAN_GRACE_S": str(s.orphan_grace_s),
            "AUDIT_RETRY_S": str(s.audit_retry_s),
        }
        if self.spec_path is not None:
            values["SPEC_PATH"] = str(self.spec_path)
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **FAUST_ENV,
            **{f"LIVELOOP_DISTILL_{k}": v for k, v in values.items()},
        }

    def start(self) -> None:
        """Start a worker process (same app id, topics and data folder as any earlier one)."""
        if self.running:
            raise RuntimeError("the worker is already running; stop or kill it first")
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts} at {datetime.now(UTC).isoformat()} =====\n".encode())
            log.flush()
            self.process = spawn_worker(self.env(), log)

    @property
    def running(self) -> bool:
        """Whether a worker process is alive."""
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until ``/healthz`` answers and the worker processes events (its partitions are assigned
        and its tables recovered): a probe ``session.started`` of a session of its own, which yields no
        sample, must show up in ``/metrics``."""
        deadline = time.monotonic() + timeout
        self.wait_until(self._healthy, deadline - time.monotonic(), "the worker's /healthz to answer")
        before = self.metric("liveloop_distill_events_total")
        probe = f"probe-{uuid.uuid4().hex}"
        self.emit([started(probe, ts=datetime.now(UTC), user_id="probe")])
        self.wait_until(
            lambda: self.metric("liveloop_distill_events_total") > before,
            deadline - time.monotonic(),
            "the worker to process a probe event",
        )

    def stop(self, timeout: float = STOP_S) -> int:
        """SIGTERM and wait for the worker to exit on its own; return its exit code. A hang fails the test."""
        process = self._process()
        if not terminate(process, timeout):
            self.kill()
            self.fail(f"the worker did not exit within {timeout} s of SIGTERM and was killed")
        return int(process.returncode)

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (no clean-up of any kind) and reap it."""
        kill_group(self._process())

    def close(self) -> None:
        """Kill a worker still running (members too), deliver what the SDK holds, close the clients."""
        if self.running:
            self.kill()
        for member in self._members:
            member.kill()
        if self._client is not None:
            self._client.close(timeout=10)
            self._client = None
        if self._producer is not None:
            self._producer.close(timeout=10)
            self._producer = None

    def __enter__(self) -> StreamHarness:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _process(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise RuntimeError("the worker was never started")
        return self.process

    # -- diagnostics -----------------------------------------------------------------------------

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the worker's log (every start appends to it)."""
        if not self.log_path.exists():
            return "(no worker log)"
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return f"--- tail of {self.log_path} ---\n{text[-chars:]}"

    def fail(self, message: str) -> NoReturn:
        """Fail the test with ``message`` and the worker's log tail."""
        pytest.fail(f"{message}\n{self.log_tail()}", pytrace=False)

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
        """Poll ``check`` until it holds; fail (with the log) on timeout or if the worker dies meanwhile."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if check():
                return
            if self.process is not None and self.process.poll() is not None:
                self.fail(f"the worker exited with {self.process.returncode} while waiting for {what}")
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(interval)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/healthz", timeout=2) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def metrics(self) -> dict[str, float]:
        """The worker's ``/metrics`` as ``{"name{labels}": value}``; empty if it does not answer."""
        return worker_metrics(self.web_port)

    def metric(self, name: str) -> float:
        """One unlabelled metric; 0 when the worker does not answer (yet)."""
        return self.metrics().get(name, 0.0)

    def start_member(self, name: str) -> Member:
        """Start one more worker of the same app, with a data folder and a web port of its own: the consumer
        group shares the partitions out between it and the harness's worker. The caller stops it."""
        port = free_port()
        env = {
            **self.env(),
            "LIVELOOP_DISTILL_DATA_DIR": str(self.settings.data_dir.with_name(f"{self.settings.data_dir.name}-{name}")),
            "LIVELOOP_DISTILL_WEB_PORT": str(port),
        }
        log_path = self.log_path.with_name(f"{self.log_path.stem}-{name}.log")
        with log_path.open("ab") as log:
            member = Member(spawn_worker(env, log), port, log_path)
        self._members.append(member)
        return member

    # -- input -----------------------------------------------------------------------------------

    def emit(self, events: Iterable[Mapping[str, Any]], timeout: float = 60.0) -> None:
        """Send events through the SDK, in order, and wait until Kafka acknowledged them all."""
        if self._client is None:
            self._client = Client(
                bootstrap=self.bootstrap,
                topic=self.events_topic,
                journal_dir=self.workdir / f"sdk-journal-{self.app_id}",
            )
        for event in events:
            self._client.emit(event)
        if not self._client.flush(timeout):
            raise AssertionError(f"the SDK did not deliver the events within {timeout} s")

    def produce_raw(self, records: Iterable[tuple[bytes | None, bytes]]) -> None:
        """Write ``(key, value)`` records straight to the events topic, past the SDK's checks."""
        if self._producer is None:
            self._producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        futures = [self._producer.send(self.events_topic, key=key, value=value) for key, value in records]
        self._producer.flush(timeout=30)
        for future in futures:
            future.get(timeout=30)

    # -- output ----------------------------------------------------------------------------------

    def query(self, statement: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one SQL query on the harness's database."""
        with psycopg.connect(self.dsn) as conn:
            return list(conn.execute(statement, params).fetchall())

    def execute(self, statement: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
        """Run one SQL statement that returns no rows, committed; return the rows it changed."""
        with psycopg.connect(self.dsn) as conn:
            return int(conn.execute(statement, params).rowcount)

    def sample_count(self) -> int:
        """Rows in ``samples``."""
        return int(self.query("SELECT count(*) FROM samples")[0][0])

    def samples(self, session_ids: Iterable[str] | None = None) -> list[Sample]:
        """The samples the worker stored (``samples.body``), of all or of the given sessions."""
        if session_ids is None:
            rows = self.query("SELECT body::text FROM samples ORDER BY sample_id")
        else:
            rows = self.query(
                "SELECT body::text FROM samples WHERE session_id = ANY(%s) ORDER BY sample_id", (list(session_ids),)
            )
        return [stored_sample(row[0]) for row in rows]

    def late_feedback(self) -> list[Json]:
        """The rows of ``late_feedback``: event_id, generation_id, sample_id, type."""
        rows = self.query("SELECT event_id, generation_id, sample_id, type FROM late_feedback ORDER BY event_id")
        return [dict(zip(("event_id", "generation_id", "sample_id", "type"), row, strict=True)) for row in rows]

    def wait_for_samples(self, count: int, timeout: float = 120.0, stable_s: float = 0.0) -> None:
        """Wait until ``samples`` holds at least ``count`` rows, then ``stable_s`` more: rows that should
        not be there (duplicates, a capped sample) would show up meanwhile, for the caller to find."""
        self.wait_until(lambda: self.sample_count() >= count, timeout, f"{count} rows in samples")
        if stable_s:
            time.sleep(stable_s)

    def topic_samples(self, timeout: float = 60.0) -> list[tuple[bytes, bytes]]:
        """Every ``(key, value)`` record on the samples topic, from the beginning to the current end."""
        return read_topic(self.bootstrap, self.samples_topic, timeout)


@dataclass
class Member:
    """Another worker of a harness's app (:meth:`StreamHarness.start_member`)."""

    process: subprocess.Popen[bytes]
    web_port: int
    log_path: Path

    def metric(self, name: str) -> float:
        """One unlabelled metric; 0 when the worker does not answer (yet)."""
        return worker_metrics(self.web_port).get(name, 0.0)

    def stop(self, timeout: float = STOP_S) -> int:
        """SIGTERM and wait for the worker to leave the group and exit; return its exit code."""
        if not terminate(self.process, timeout):
            self.kill()
            pytest.fail(f"a member did not exit within {timeout} s of SIGTERM; log: {self.log_path}")
        return int(self.process.returncode)

    def kill(self) -> None:
        kill_group(self.process)


def spawn_worker(env: Mapping[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """A ``python -m distill.app`` worker in a process group of its own, its output appended to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "distill.app"],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def terminate(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """SIGTERM ``process`` (if it runs) and wait for it to exit; False if it did not within ``timeout``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
    return True


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process``'s whole process group (no clean-up of any kind) and reap it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=STOP_S)


def worker_metrics(port: int) -> dict[str, float]:
    """A worker's ``/metrics`` as ``{"name{labels}": value}``; empty if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> list[tuple[bytes, bytes]]:
    """Every record of ``topic`` from the beginning up to its end offsets now, as ``(key, value)``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=1000)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        records: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end[tp] for tp in partitions):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end within {timeout} s")
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend((r.key, r.value) for r in batch)
        return records
    finally:
        consumer.close(autocommit=False)


def dump_json(value: Any) -> bytes:
    """Compact JSON bytes, for records sent with :meth:`StreamHarness.produce_raw`."""
    return json.dumps(value, separators=(",", ":")).encode()


class SteadyLoad:
    """Simple sessions (four events each) sent to a harness in the background, ``per_tick`` sessions every 0.2 s,
    until :meth:`stop` or ``most`` sessions; :attr:`sent` holds their generation ids. Session and generation
    ids derive from ``name``, so they are unique to the test."""

    def __init__(self, harness: StreamHarness, name: str, per_tick: int = 100, most: int = 20_000) -> None:
        self.harness = harness
        self.sent: list[uuid.UUID] = []
        self._name = name
        self._per_tick = per_tick
        self._most = most
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)

    def start(self) -> SteadyLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending and wait for the sender; fails if it does not end."""
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the sender did not stop"

    def _send(self) -> None:
        now = datetime.now(UTC)
        namespace = uuid.uuid5(uuid.NAMESPACE_URL, f"liveloop-steady-load/{self._name}")
        while not self._stop.is_set() and len(self.sent) < self._most:
            first = len(self.sent)
            batch = [uuid.uuid5(namespace, str(first + i)) for i in range(self._per_tick)]
            self.harness.emit(
                event
                for i, generation_id in enumerate(batch, start=first)
                for event in simple_session(f"{self._name}-{i}", generation_id, ts=now, user_id=f"user-{i % 2000}")
            )
            self.sent.extend(batch)
            time.sleep(0.2)


def assert_one_sample_per_generation(harness: StreamHarness, sent: Sequence[uuid.UUID]) -> None:
    """Every generation in ``sent`` got exactly one row in ``samples`` and one sample id on the samples topic
    (repeats only under that id), and the group's committed offsets reach the end of every events partition."""
    rows = harness.query("SELECT generation_id, count(*) FROM samples GROUP BY generation_id")
    missing = set(sent) - {row[0] for row in rows}
    assert not missing, f"{len(missing)} of {len(sent)} generations have no sample"
    assert {row[0] for row in rows} == set(sent), "a sample of a generation that was not sent"
    assert all(row[1] == 1 for row in rows), "a generation stored twice"
    ids_by_generation: dict[str, set[str]] = {}
    for _, value in harness.topic_samples():
        sample = parse_sample(value)
        ids_by_generation.setdefault(str(sample.generation_id), set()).add(sample.sample_id)
    assert set(ids_by_generation) == {str(g) for g in sent}, "the samples topic lacks a generation"
    assert {len(ids) for ids in ids_by_generation.values()} == {1}, "a generation published under two ids"

    def lag() -> int:
        return consumer_lag(harness.bootstrap, harness.app_id, [harness.events_topic])

    harness.wait_until(lambda: lag() == 0, 60, "the committed offsets to reach the end of the events")
