"""Benchmark: ``liveloop replay``'s range replay against a plain scan of the same rows, export throughput,
and peak memory at two range sizes.

Data: ``EVENTS`` archived events (sessions of 20: a start, five generations each with two feedback events,
an end... see :func:`_session`) written through the real archiver's batch writer, and their samples derived
with the stream's scoring code and stored through the distiller's sink, in a fresh database.

Measured (``replay_throughput``, events/s): :func:`distill.replay_range.compare_range` over the whole range
under the recorded spec, with its default workers (one process per core: ``liveloop replay``'s default): stream
events and recorded samples, re-derive, compare. Baseline: the same events
query through a server-side cursor, each row's ``body`` decoded into a Python dict by psycopg, nothing else.
The two alternate run by run. Goal (issue 41): at least 0.5 of the plain scan.

Also recorded: ``export_throughput`` (rows/s of :func:`liveloop.parquet_export.export_range`, events plus
samples, against the same plain scan in rows/s; no goal), and the peak RSS of a fresh process replaying the
first ``MEMORY_SIZES`` events, and of its largest worker (neither must grow with the range). The defaults
keep ``make bench`` modest on 2 cores; ``LIVELOOP_BENCH_REPLAY_EVENTS`` and
``LIVELOOP_BENCH_REPLAY_MEMORY_SIZES`` (comma-separated; the issue asks for 200000,1000000) raise them. Never
asserts on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from distill.replay import replay_session
from distill.replay_range import compare_range
from distill.sink import AuditSink
from distill.spec import load_spec
from infra.migrations import migrate
from infra.stack import Endpoints
from ingest.archive_reads import SESSIONS_IN_RANGE
from ingest.archiver import Batch, prepare, write_batch
from ingest.events import Event, parse_event
from liveloop.parquet_export import export_range
from tests.bench.results import write_result

EVENTS = int(os.environ.get("LIVELOOP_BENCH_REPLAY_EVENTS", "200000"))
MEMORY_SIZES = [int(n) for n in os.environ.get("LIVELOOP_BENCH_REPLAY_MEMORY_SIZES", "50000,200000").split(",")]
SESSION_EVENTS = 20
RUNS = 3
BATCH = 2_000
START = datetime(2026, 11, 1, tzinfo=UTC)
_SCAN = f"""
    SELECT session_id, body FROM events WHERE session_id IN ({SESSIONS_IN_RANGE})
    ORDER BY session_id COLLATE "C", kafka_partition, kafka_offset
"""
_PEAK = """
import json, resource, sys
from datetime import datetime
from distill.replay_range import compare_range

def status(name):
    # /proc's VmHWM is this process's own high-water mark. getrusage's ru_maxrss is not: it keeps the one of
    # the process that forked this one (pytest's, hundreds of MB), which hid any growth behind it.
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) for line in lines if line.startswith(name + ":"))

dsn, start, end = sys.argv[1], datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3])
before = status("VmRSS")
result = compare_range(dsn, start, end)
# The workers have been joined: the largest one's peak. An upper bound: a child's count starts from the pages
# it shared with this process when it was started.
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
measured = {"sessions": result.sessions, "rss_before_kb": before, "rss_peak_kb": status("VmHWM")}
print(json.dumps(measured | {"workers_kb": workers}))
"""


def _session(index: int) -> list[dict[str, Any]]:
    """The :data:`SESSION_EVENTS` events of session ``index`` (at ``START + index`` seconds): a start, five
    generations each followed by an accept or a thumbs up and a persisted edit, follow-ups, an end."""
    sid, user = f"bench-{index:08d}", f"user-{index % 97}"
    ts = (START + timedelta(seconds=index)).isoformat().replace("+00:00", "Z")
    prompt = "".join(f"    total += item_{k}.price * item_{k}.quantity\n" for k in range(6))

    def event(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        envelope = {"event_id": str(uuid.uuid4()), "type": kind, "ts": ts, "session_id": sid, "user_id": user}
        return {**envelope, "tenant": "acme", "payload": payload}

    events = [event("session.started", {"surface": "ide.tab", "client": "bench"})]
    gen = ""
    for g in range(5):
        gen = str(uuid.uuid4())
        completion = {"completion": "    return total\n", "completion_token_ids": list(range(12))}
        tokens = {"prompt_token_ids": list(range(40)), "completion_logprobs": [-0.5] * 12}
        payload = {"generation_id": gen, "model": "liveloop-tiny", "policy_version": 3, "prompt": prompt}
        events.append(event("generation", {**payload, **completion, **tokens, "surface": "ide.tab"}))
        if g % 2:
            events.append(event("suggestion.accepted", {"generation_id": gen}))
        else:
            events.append(event("rating", {"generation_id": gen, "thumbs": "up"}))
        events.append(event("edit.persisted", {"generation_id": gen, "fraction_remaining": 0.5, "seconds_after": 60.0}))
    while len(events) < SESSION_EVENTS - 1:
        events.append(event("followup", {"generation_id": gen, "dissatisfied": False, "rephrase": False}))
    return [*events, event("session.ended", {"reason": "closed"})]


def _fill(dsn: str, events: int) -> None:
    """Archive ``events`` events through the archiver's writer and store their samples through the sink."""
    migrate(dsn)
    spec = load_spec()
    sink = AuditSink(dsn)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(sink.record_spec(spec))
    offset = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        prepare(conn)
        for first in range(0, events // SESSION_EVENTS, BATCH // SESSION_EVENTS):
            batch, samples = Batch(), []
            for index in range(first, min(first + BATCH // SESSION_EVENTS, events // SESSION_EVENTS)):
                parsed: list[Event] = []
                for body in _session(index):
                    raw = json.dumps(body).encode()
                    parsed.append(parse_event(raw))
                    batch.add_event(parsed[-1], raw, partition=0, offset=offset)
                    offset += 1
                samples += replay_session(parsed, (), spec)
            write_batch(conn, batch)
            loop.run_until_complete(sink.write_samples(samples))
        # An archive at rest has been vacuumed. Rows read for the first time after they were written get their
        # hint bits set by that read, which would make whichever side reads first pay for it.
        conn.execute("VACUUM (ANALYZE)")
    loop.run_until_complete(sink.close())
    loop.close()


def _end_of(events: int) -> datetime:
    return START + timedelta(seconds=events // SESSION_EVENTS)


def _scan(dsn: str, end: datetime) -> int:
    rows = 0
    with psycopg.connect(dsn) as conn, conn.cursor(name="plain_scan") as cursor:
        cursor.itersize = BATCH
        cursor.execute(_SCAN, {"start": START, "end": end})
        for _, body in cursor:
            assert isinstance(body, dict)
            rows += 1
    return rows


def _timed(run: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = run()
    return time.perf_counter() - started, value


def _peak(dsn: str, events: int) -> dict[str, Any]:
    """Peak RSS (VmHWM) of a fresh process replaying the first ``events`` events, and its RSS after the imports."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = [sys.executable, "-c", _PEAK, dsn, START.isoformat(), _end_of(events).isoformat()]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, check=True)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "events": events,
        "sessions": measured["sessions"],
        "peak_rss_mb": round(measured["rss_peak_kb"] / 1024, 1),
        "largest_worker_peak_rss_mb": round(measured["workers_kb"] / 1024, 1),
        "rss_after_imports_mb": round(measured["rss_before_kb"] / 1024, 1),
    }


@pytest.fixture
def database(endpoints: Endpoints) -> Iterator[str]:
    """A fresh database, dropped afterwards."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = endpoints.dsn("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield endpoints.dsn(name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.timeout(3600)  # 200,000 events replayed three times on a busy 2-core machine take a while
def test_replay_throughput_export_and_peak_memory(database: str) -> None:
    dsn = database
    fill_s, _ = _timed(partial(_fill, dsn, max(EVENTS, *MEMORY_SIZES)))
    print(f"[bench] replay: {max(EVENTS, *MEMORY_SIZES):,} events archived and distilled in {fill_s:.0f} s", flush=True)
    end = _end_of(EVENTS)
    replay_s: list[float] = []
    scan_s: list[float] = []
    export_s: list[float] = []
    exported = 0
    for run in range(RUNS):
        order = ("replay", "scan") if run % 2 == 0 else ("scan", "replay")
        for side in order:
            if side == "replay":
                seconds, result = _timed(partial(compare_range, dsn, START, end))
                assert result.no_differences, result.as_dict()["counts"]
                replay_s.append(seconds)
            else:
                seconds, rows = _timed(partial(_scan, dsn, end))
                assert rows == EVENTS
                scan_s.append(seconds)
        with tempfile.TemporaryDirectory() as folder:
            seconds, counts = _timed(partial(export_range, dsn, START, end, Path(folder)))
            export_s.append(seconds)
            exported = counts.events + counts.samples
        print(f"[bench] replay: run {run + 1}: replay {replay_s[-1]:.1f} s, scan {scan_s[-1]:.1f} s", flush=True)
    memory = [_peak(dsn, size) for size in sorted(MEMORY_SIZES)]
    replay_rate = EVENTS / statistics.median(replay_s)
    scan_rate = EVENTS / statistics.median(scan_s)
    export_rate = exported / statistics.median(export_s)
    extra = {"events": EVENTS, "fill_s": round(fill_s, 1), "peak_memory": memory, "export_rows_per_s": export_rate}
    write_result("replay_throughput", "events/s", replay_rate, "plain_scan_into_dicts", scan_rate, 0.5, RUNS, extra)
    write_result(
        "export_throughput",
        "rows/s",
        export_rate,
        "plain_scan_into_dicts",
        scan_rate,
        None,
        RUNS,
        {"rows": exported, "events": EVENTS, "goal": None},
    )
