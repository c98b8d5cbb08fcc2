"""The distiller's audit sink rides out a database outage: it waits and retries, it never drops a batch.

The database sits behind a small TCP relay that the test closes and reopens, which is what a restart
of PostgreSQL looks like to a client (refused connections, dropped connections), without stopping the
session's server that other tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from distill.errors import AuditStoreUnavailable
from distill.samples import Sample, parse_sample, sample_id_for
from distill.sink import AuditSink
from distill.spec import load_spec
from infra.migrations import migrate
from infra.stack import Endpoints
from tests.conftest import free_port
from tests.distill.stream_harness import StreamHarness, feedback, simple_session
from tests.learner.sample_factory import make_sample


class Relay:
    """Forwards 127.0.0.1:<port> to the database while open; refuses and cuts connections while closed."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            finally:
                sink.close()

        for task in (
            asyncio.create_task(pipe(reader, upstream_writer)),
            asyncio.create_task(pipe(upstream_reader, writer)),
        ):
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)


class ThreadedRelay:
    """A :class:`Relay` served by an event loop of its own, in a thread: for a test that waits on a worker process."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.relay = Relay(target_host, target_port)
        self.port = self.relay.port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def open(self) -> None:
        asyncio.run_coroutine_threadsafe(self.relay.open(), self._loop).result(timeout=30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.relay.close(), self._loop).result(timeout=30)

    def stop(self) -> None:
        self.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


def _relayed(dsn: str, port: int) -> tuple[str, str, int]:
    """(the DSN through the relay on ``port``, the real host, the real port)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    host, real_port = str(info.get("host", "127.0.0.1")), int(info.get("port", 5432))
    return psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=port), host, real_port


def _samples(spec_hash: str, first: int, count: int) -> list[Sample]:
    samples = []
    for number in range(first, first + count):
        generation_id = uuid.uuid5(uuid.NAMESPACE_URL, f"sink-outage/{number}")
        sample_id = sample_id_for(generation_id, spec_hash)
        samples.append(make_sample(number, generation_id=generation_id, sample_id=sample_id, spec_hash=spec_hash))
    return samples


def _stored(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT count(*) FROM samples").fetchone()[0])  # type: ignore[index]


def test_a_write_during_an_outage_waits_and_lands(fresh_database: str) -> None:
    migrate(fresh_database)
    spec = load_spec()

    async def scenario() -> None:
        info = psycopg.conninfo.conninfo_to_dict(fresh_database)
        relay = Relay(str(info.get("host", "127.0.0.1")), int(info.get("port", 5432)))
        dsn, _, _ = _relayed(fresh_database, relay.port)
        await relay.open()
        sink = AuditSink(dsn, retry_for_s=60)
        try:
            await sink.record_spec(spec)
            await sink.write_samples(_samples(spec.spec_hash, 0, 5))
            await relay.close()  # the database goes away: open connections are cut, new ones refused
            writing = asyncio.create_task(sink.write_samples(_samples(spec.spec_hash, 5, 5)))
            await asyncio.sleep(3.0)
            assert not writing.done(), "the write returned while the database was unreachable"
            await relay.open()  # back again
            await asyncio.wait_for(writing, timeout=60)
        finally:
            await sink.close()
            await relay.close()

    asyncio.run(scenario())
    assert _stored(fresh_database) == 10


def test_a_database_that_stays_away_fails_the_write_loudly(fresh_database: str) -> None:
    nobody = free_port()
    dsn, _, _ = _relayed(fresh_database, nobody)
    spec = load_spec()

    async def scenario() -> None:
        sink = AuditSink(dsn, retry_for_s=2)
        try:
            await sink.write_samples(_samples(spec.spec_hash, 0, 1))
        finally:
            with contextlib.suppress(Exception):
                await sink.close()

    with pytest.raises(AuditStoreUnavailable, match="could not write 1 samples to PostgreSQL"):
        asyncio.run(scenario())


def test_a_distiller_whose_database_stays_away_exits_for_its_keeper(
    endpoints: Endpoints, fresh_database: str, tmp_path: Path
) -> None:
    """A failed agent ends the worker (so the keeper starts a fresh one that re-reads what was not committed)
    instead of Faust restarting the agent in place and carrying on past the batch it failed."""
    harness = StreamHarness(endpoints.kafka_bootstrap, fresh_database, tmp_path / "distill")
    nobody = free_port()
    dsn, _, _ = _relayed(fresh_database, nobody)
    env = {**harness.env(), "LIVELOOP_DISTILL_DSN": dsn, "LIVELOOP_DISTILL_AUDIT_RETRY_S": "2"}
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "distill.app"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = worker.wait(timeout=180)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    assert code != 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert "AuditStoreUnavailable" in (tmp_path / "worker.log").read_text()


@contextlib.contextmanager
def _worker_behind_relay(
    endpoints: Endpoints, fresh_database: str, tmp_path: Path
) -> Iterator[tuple[StreamHarness, ThreadedRelay]]:
    """A ready distiller worker whose database sits behind an open relay; it gives up on an unreachable
    database after 3 s. Both are stopped on the way out."""
    info = psycopg.conninfo.conninfo_to_dict(fresh_database)
    relay = ThreadedRelay(str(info.get("host", "127.0.0.1")), int(info.get("port", 5432)))
    relay.open()
    dsn, _, _ = _relayed(fresh_database, relay.port)
    harness = StreamHarness(endpoints.kafka_bootstrap, dsn, tmp_path / "distill")
    harness.settings = harness.settings.model_copy(update={"audit_retry_s": 3.0})
    try:
        harness.start()
        harness.wait_ready()
        yield harness, relay
    finally:
        harness.close()
        relay.stop()


def test_a_batch_whose_write_fails_ends_the_worker_even_when_no_batch_follows(
    endpoints: Endpoints, fresh_database: str, tmp_path: Path
) -> None:
    """The admit stage stores a batch while it admits the next. A write that fails must still end the
    worker when no later batch comes to find it out, and the next worker stores what it could not."""
    with _worker_behind_relay(endpoints, fresh_database, tmp_path) as (harness, relay):
        now = datetime.now(UTC)
        harness.emit(simple_session(f"before-{uuid.uuid4()}", uuid.uuid4(), ts=now, user_id="user-a"))
        harness.wait_for_samples(1)
        relay.close()  # the database goes away and stays away past the worker's retries
        harness.emit(simple_session(f"during-{uuid.uuid4()}", uuid.uuid4(), ts=now, user_id="user-b"))
        # The sample reaches the topic before its batch is stored; nothing else reaches the admit stage.
        harness.wait_until(lambda: len(harness.topic_samples()) == 2, timeout=60, what="the second sample on the topic")
        assert harness.process is not None
        code = harness.process.wait(timeout=120)
        assert code != 0, harness.log_tail()
        assert "Crashed reason=AuditStoreUnavailable" in harness.log_path.read_text(), harness.log_tail()
        relay.open()
        harness.start()  # what the keeper does
        harness.wait_for_samples(2)
        stored = {sample.sample_id for sample in harness.samples()}
        assert stored == {parse_sample(value).sample_id for _, value in harness.topic_samples()}


def test_a_session_batch_that_fails_is_read_again_by_the_next_worker(
    endpoints: Endpoints, fresh_database: str, tmp_path: Path
) -> None:
    """A batch of the session stage that fails part-way (here: recording late feedback while the database
    is away) must leave its records uncommitted when the worker ends, so that the next worker reads them
    again. Faust's ``take_events`` acknowledged a batch's records once the batch was given up, failed or
    not, and the worker's final commit then moved past them: the feedback was never recorded, and a session
    whose events shared the batch lost them."""
    with _worker_behind_relay(endpoints, fresh_database, tmp_path) as (harness, relay):
        now = datetime.now(UTC)
        session, generation_id = f"ended-{uuid.uuid4()}", uuid.uuid4()
        harness.emit(simple_session(session, generation_id, ts=now, user_id="user-a"))
        harness.wait_for_samples(1)
        relay.close()  # the database goes away and stays away past the worker's retries
        late = feedback("suggestion.rejected", session, generation_id, ts=now + timedelta(seconds=5), user_id="user-a")
        harness.emit([late])
        assert harness.process is not None
        code = harness.process.wait(timeout=120)
        assert code != 0, harness.log_tail()
        assert "AuditStoreUnavailable" in harness.log_path.read_text(), harness.log_tail()
        relay.open()
        harness.start()  # what the keeper does
        harness.wait_until(
            lambda: [row["event_id"] for row in harness.late_feedback()] == [uuid.UUID(late["event_id"])],
            timeout=90,
            what="the late feedback of the failed batch to be recorded by the next worker",
        )
