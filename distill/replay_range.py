"""Replay a time range of the archive and compare, generation by generation, with the recorded samples.

:func:`distill.replay.replay_session` re-derives a session's samples with the stream's own code; this
module runs it over every session with an event in ``[start, end)`` and compares each re-derived sample
with the sample the stream recorded for the same generation under the *recorded* spec. Under the recorded
spec a sample matches only bit for bit; under another spec (a new weight, say) sample ids and the spec
fields differ by construction, so a generation differs when its reward, a component, or any other field
of the sample differs.

Memory stays bounded however long the range: the archived events (:func:`ingest.archive_reads.session_bodies`),
the recorded samples and the feedback the stream recorded as late stream in side by side through three
server-side cursors, all ordered by session id in byte order, and are merged one session at a time. This
process only reads; worker processes parse, replay and compare pieces of a few thousand events (a replay is
CPU-bound in Python), and their outcomes are merged in reading order.
Distributions are kept as running moments and fixed-bin histograms over the specs' clip ranges; the
differing generations go to a caller's callback (the command line writes them to a file), and only the
first :data:`distill.replay.LISTED` stay in the result.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

import psycopg

from distill.errors import AuditStoreUnavailable
from distill.replay import LISTED, ReplayFailed, replay_session, stored_sample
from distill.samples import Sample, sample_to_json
from distill.spec import RewardSpec, parse_spec
from ingest.archive_reads import BATCH_ROWS, PRIVATE_SESSIONS, SESSIONS_IN_RANGE, archived_event, session_bodies

T = TypeVar("T")

BINS = 20
"""Bins of each reward histogram, spread evenly over the union of both specs' clip ranges."""

MAX_WORKERS = 8
"""The most worker processes :func:`default_workers` picks: PostgreSQL and the reading process need cores too."""

CHUNK_EVENTS = 2_000
"""About how many events a worker replays per piece of work: enough that sending it over costs little beside
replaying it, few enough that the pieces in flight (at most two per worker) keep memory bounded."""

_RECORDED_HASHES = f"""
    SELECT spec_hash, count(*) FROM samples WHERE session_id IN ({SESSIONS_IN_RANGE})
    GROUP BY spec_hash ORDER BY count(*) DESC, spec_hash
"""
_SPEC_BODY = "SELECT body::text FROM reward_specs WHERE spec_hash = %(hash)s"
_STORED = f"""
    SELECT session_id, body::text FROM samples
    WHERE spec_hash = %(hash)s AND session_id IN ({SESSIONS_IN_RANGE})
      AND (body->>'privacy_mode')::boolean IS NOT TRUE AND session_id NOT IN ({PRIVATE_SESSIONS})
    ORDER BY session_id COLLATE "C", sample_id
"""
_STORED_OF = f"""
    SELECT session_id, body::text FROM samples
    WHERE spec_hash = %(hash)s AND session_id IN ({SESSIONS_IN_RANGE}) AND session_id = ANY(%(sessions)s)
      AND (body->>'privacy_mode')::boolean IS NOT TRUE AND session_id NOT IN ({PRIVATE_SESSIONS})
    ORDER BY session_id COLLATE "C", sample_id
"""
_LATE = f"""
    SELECT e.session_id, l.event_id FROM late_feedback l JOIN events e USING (event_id)
    WHERE e.session_id IN ({SESSIONS_IN_RANGE}) ORDER BY e.session_id COLLATE "C"
"""
# Fields that differ between two specs' samples of one generation by construction, not by re-derivation.
_SPEC_FIELDS = frozenset({"sample_id", "spec_hash", "spec_version"})


class NoRecordedSpec(ReplayFailed):
    """The range holds no recorded samples, or their spec is not in ``reward_specs``: pass a spec to replay under."""


@dataclass
class Moments:
    """Count, mean and variance of a stream of values (Welford), plus a fixed-bin histogram."""

    low: float
    high: float
    count: int = 0
    mean: float = 0.0
    _m2: float = 0.0
    histogram: list[int] = field(default_factory=lambda: [0] * BINS)

    def add(self, value: float) -> None:
        """Take one value in; values outside ``[low, high]`` go to the first or last bin."""
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)
        width = (self.high - self.low) / BINS
        self.histogram[min(max(int((value - self.low) // width), 0), BINS - 1)] += 1

    def merge(self, other: Moments) -> None:
        """Take in every value ``other`` took (same bins): Chan et al.'s pairwise update of the mean and variance."""
        if not other.count:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.mean += delta * other.count / total
        self._m2 += other._m2 + delta * delta * self.count * other.count / total
        self.count = total
        self.histogram = [mine + theirs for mine, theirs in zip(self.histogram, other.histogram, strict=True)]

    @property
    def std(self) -> float:
        """Population standard deviation (0 for fewer than two values)."""
        return math.sqrt(self._m2 / self.count) if self.count > 1 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The moments and histogram as JSON-ready values."""
        return {"count": self.count, "mean": self.mean, "std": self.std, "histogram": list(self.histogram)}


@dataclass
class ComponentDelta:
    """How one reward component moved between the recorded and the re-derived samples of the same generations."""

    changed: int = 0
    total: float = 0.0
    smallest: float = math.inf
    largest: float = -math.inf

    def add(self, delta: float) -> None:
        """Count one generation whose component moved by ``delta`` (non-zero)."""
        self.changed += 1
        self.total += delta
        self.smallest = min(self.smallest, delta)
        self.largest = max(self.largest, delta)

    def merge(self, other: ComponentDelta) -> None:
        """Take in every generation ``other`` counted."""
        self.changed += other.changed
        self.total += other.total
        self.smallest = min(self.smallest, other.smallest)
        self.largest = max(self.largest, other.largest)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: generations changed, the sum, mean, smallest and largest delta."""
        mean = self.total / self.changed if self.changed else 0.0
        low, high = (self.smallest, self.largest) if self.changed else (0.0, 0.0)
        return {"changed": self.changed, "total": self.total, "mean": mean, "min": low, "max": high}


@dataclass
class RangeComparison:
    """What replaying a range gave, against what the stream recorded (see the module docstring)."""

    start: datetime
    end: datetime
    recorded_spec_hash: str
    replay_spec_hash: str
    sessions: int = 0
    recorded: int = 0
    replayed: int = 0
    compared: int = 0
    identical: int = 0
    differing: int = 0
    missing_in_stream: int = 0
    missing_in_replay: int = 0
    component_deltas: dict[str, ComponentDelta] = field(default_factory=dict)
    recorded_rewards: Moments = field(default_factory=lambda: Moments(-1.0, 1.0))
    replayed_rewards: Moments = field(default_factory=lambda: Moments(-1.0, 1.0))
    listed: list[dict[str, Any]] = field(default_factory=list)

    def empty_like(self) -> RangeComparison:
        """A comparison of the same range, specs and bins with nothing counted yet (a worker's share)."""
        recorded, replayed = self.recorded_rewards, self.replayed_rewards
        return RangeComparison(
            start=self.start,
            end=self.end,
            recorded_spec_hash=self.recorded_spec_hash,
            replay_spec_hash=self.replay_spec_hash,
            recorded_rewards=Moments(recorded.low, recorded.high),
            replayed_rewards=Moments(replayed.low, replayed.high),
        )

    def absorb(self, share: RangeComparison) -> None:
        """Add the counts, component deltas and distributions of ``share`` (one of :meth:`empty_like`'s) to these;
        its listed differences are not taken: the caller notes each of them in order."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(share, name))
        for name, delta in share.component_deltas.items():
            self.component_deltas.setdefault(name, ComponentDelta()).merge(delta)
        self.recorded_rewards.merge(share.recorded_rewards)
        self.replayed_rewards.merge(share.replayed_rewards)

    @property
    def no_differences(self) -> bool:
        """Whether every generation was found on both sides and re-derived exactly as recorded."""
        return not (self.differing or self.missing_in_stream or self.missing_in_replay)

    def as_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready values (``report.json``)."""
        return {
            "range": {"from": self.start.isoformat(), "to": self.end.isoformat()},
            "recorded_spec_hash": self.recorded_spec_hash,
            "replay_spec_hash": self.replay_spec_hash,
            "counts": {name: getattr(self, name) for name in _COUNTS},
            "no_differences": self.no_differences,
            "component_deltas": {name: d.as_dict() for name, d in sorted(self.component_deltas.items())},
            "distribution": {
                "bins": {"low": self.recorded_rewards.low, "high": self.recorded_rewards.high, "count": BINS},
                "recorded": self.recorded_rewards.as_dict(),
                "replayed": self.replayed_rewards.as_dict(),
                "mean_shift": self.replayed_rewards.mean - self.recorded_rewards.mean,
                "total_variation": total_variation(self.recorded_rewards.histogram, self.replayed_rewards.histogram),
            },
            "first_differences": self.listed,
        }


_COUNTS = (
    "sessions",
    "recorded",
    "replayed",
    "compared",
    "identical",
    "differing",
    "missing_in_stream",
    "missing_in_replay",
)
"""The counts of a :class:`RangeComparison`, in the order its report lists them."""


def default_workers() -> int:
    """How many processes a replay uses unless told: one per core this process may run on, at most
    :data:`MAX_WORKERS`."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def total_variation(first: list[int], second: list[int]) -> float:
    """Total variation distance between two histograms over the same bins (0: same shape, 1: disjoint)."""
    a, b = sum(first), sum(second)
    if not a or not b:
        return 0.0 if a == b else 1.0
    return 0.5 * sum(abs(x / a - y / b) for x, y in zip(first, second, strict=True))


def recorded_spec(conn: psycopg.Connection[Any], start: datetime, end: datetime) -> RewardSpec:
    """The spec most of the range's recorded samples were scored under, read back from ``reward_specs``."""
    spec = recorded_spec_or_none(conn, start, end)
    if spec is None:
        raise NoRecordedSpec(f"no samples are recorded for sessions between {start} and {end}; pass --spec")
    return spec


def recorded_spec_or_none(conn: psycopg.Connection[Any], start: datetime, end: datetime) -> RewardSpec | None:
    """:func:`recorded_spec`, or None when the range holds no recorded samples."""
    row = conn.execute(_RECORDED_HASHES, {"start": start, "end": end}).fetchone()
    return None if row is None else spec_by_hash(conn, str(row[0]))


def spec_by_hash(conn: psycopg.Connection[Any], spec_hash: str) -> RewardSpec:
    """The spec stored under ``spec_hash`` in ``reward_specs``; :class:`NoRecordedSpec` if it is not there."""
    row = conn.execute(_SPEC_BODY, {"hash": spec_hash}).fetchone()
    if row is None:
        raise NoRecordedSpec(f"reward spec {spec_hash} is not in reward_specs; pass the spec file with --spec")
    spec = parse_spec(str(row[0]), f"reward_specs[{spec_hash[:12]}]")
    if spec.spec_hash != spec_hash:
        raise NoRecordedSpec(f"reward_specs[{spec_hash[:12]}] re-hashes to {spec.spec_hash[:12]}; it was altered")
    return spec


def compare_range(
    dsn: str,
    start: datetime,
    end: datetime,
    spec: RewardSpec | None = None,
    session_ids: Collection[str] | None = None,
    *,
    on_difference: Callable[[dict[str, Any]], None] | None = None,
    on_session: Callable[[int], None] | None = None,
    on_replayed: Callable[[Sample], None] | None = None,
    now: datetime | None = None,
    batch_rows: int = BATCH_ROWS,
    workers: int | None = None,
) -> RangeComparison:
    """Replay the sessions with an event in ``[start, end)`` (only ``session_ids``, when given) under ``spec``
    (default: the recorded one) and compare with the samples recorded under the recorded spec.

    ``on_difference`` gets every differing generation's record, ``on_session`` the number of events of each
    session read, ``on_replayed`` every re-derived sample (to publish it). A generation whose session has not
    ended and whose windows are open at ``now`` (default: the current time) is not final and is left out.

    This process reads the store; ``workers`` processes (default :func:`default_workers`; 1: this process
    alone) parse and replay the sessions. Whatever their number, the result, the callbacks and their order
    are those of a replay in one process. Raises :class:`ReplayFailed` if the store cannot be read or a
    worker process dies.
    """
    moment = now or datetime.now(UTC)
    params = {"start": start, "end": end, "sessions": list(session_ids or ())}
    try:
        with psycopg.connect(dsn) as conn:
            # With a spec given, a range with nothing recorded still replays (every sample missing in the stream).
            recorded = (
                recorded_spec(conn, start, end) if spec is None else (recorded_spec_or_none(conn, start, end) or spec)
            )
            replay = spec or recorded
            low = min(recorded.clip[0], replay.clip[0])
            high = max(recorded.clip[1], replay.clip[1])
            result = RangeComparison(
                start=start,
                end=end,
                recorded_spec_hash=recorded.spec_hash,
                replay_spec_hash=replay.spec_hash,
                recorded_rewards=Moments(low, high),
                replayed_rewards=Moments(low, high),
            )
            job = _Job(result.empty_like(), replay, moment, keep_replayed=on_replayed is not None)

            def merge(outcome: _Outcome) -> None:
                result.absorb(outcome.comparison)
                for record in outcome.differences:
                    _note(result, record, on_difference)
                if on_replayed is not None:
                    for sample in outcome.replayed:
                        on_replayed(sample)
                if on_session is not None:
                    for events in outcome.events_read:
                        on_session(events)

            with (
                _Replayer(default_workers() if workers is None else workers, job, merge) as replayer,
                conn.cursor(name="replay_stored_samples") as stored_cursor,
                conn.cursor(name="replay_late_feedback") as late_cursor,
            ):
                stored_cursor.itersize = late_cursor.itersize = batch_rows
                stored_query = _STORED if session_ids is None else _STORED_OF
                stored_cursor.execute(stored_query, {**params, "hash": recorded.spec_hash})
                late_cursor.execute(_LATE, params)

                def unreplayed(session_id: str, bodies: list[str]) -> None:
                    replayer.add(_Session(session_id, [], bodies, []))  # recorded, but no archived events

                stored = _BySession(stored_cursor, str, unreplayed)
                late = _BySession(late_cursor, _as_uuid)
                for session_id, events in session_bodies(conn, start, end, session_ids, batch_rows=batch_rows):
                    replayer.add(_Session(session_id, events, stored.take(session_id), late.take(session_id)))
                stored.finish()
                replayer.finish()
    except psycopg.OperationalError as exc:
        raise AuditStoreUnavailable(f"the audit store did not answer: {exc}; check that PostgreSQL runs") from exc
    except psycopg.Error as exc:
        raise ReplayFailed(f"reading the audit store failed: {exc}; check the DSN and run the migrations") from exc
    except BrokenProcessPool as exc:
        raise ReplayFailed(f"a replay worker process died: {exc}; check memory, or run again with one worker") from exc
    return result


@dataclass(frozen=True)
class _Session:
    """One session as read from the store, not parsed yet: its events' and its recorded samples' JSON texts."""

    session_id: str
    events: list[str]
    recorded: list[str]
    late: list[UUID]


@dataclass(frozen=True)
class _Job:
    """What every piece of a replay shares: an empty comparison to count into, the spec, the time it runs at."""

    empty: RangeComparison
    spec: RewardSpec
    now: datetime
    keep_replayed: bool


@dataclass(frozen=True)
class _Outcome:
    """What replaying a piece gave: its counts, its differences in order, its samples if asked for, and the
    number of events of each of its sessions (for progress)."""

    comparison: RangeComparison
    differences: list[dict[str, Any]]
    replayed: list[Sample]
    events_read: list[int]


def _replay_piece(job: _Job, sessions: list[_Session]) -> _Outcome:
    """Parse and replay ``sessions`` and compare each with its recorded samples (in a worker process, or here)."""
    comparison = job.empty.empty_like()
    differences: list[dict[str, Any]] = []
    kept: list[Sample] = []
    for session in sessions:
        events = [archived_event(body) for body in session.events]
        replayed = replay_session(events, set(session.late), job.spec, now=job.now)
        comparison.sessions += 1 if events else 0
        _compare_session(comparison, replayed, [stored_sample(body) for body in session.recorded], differences.append)
        if job.keep_replayed:
            kept += replayed
    return _Outcome(comparison, differences, kept, [len(session.events) for session in sessions if session.events])


class _Replayer:
    """Replays sessions in pieces of about :data:`CHUNK_EVENTS` events, here (one worker) or in a pool of spawned
    processes, and hands each piece's outcome to ``merge`` in reading order, so that the result does not depend
    on the number of workers. At most two pieces per worker are in flight: memory stays bounded."""

    def __init__(self, workers: int, job: _Job, merge: Callable[[_Outcome], None]) -> None:
        self._job, self._merge, self._workers = job, merge, workers
        # Spawned, not forked: the caller may run threads (a progress bar, a Kafka producer) a fork would copy.
        context = multiprocessing.get_context("spawn")
        self._pool: ProcessPoolExecutor | None = None
        if workers > 1:
            self._pool = ProcessPoolExecutor(workers, mp_context=context)
            for _ in range(workers):
                # The pool starts a process per piece submitted while none is idle: start them all now, so that
                # they import while PostgreSQL sorts the range, before the first piece is read.
                self._pool.submit(int)
        self._pending: deque[Future[_Outcome]] = deque()
        self._piece: list[_Session] = []
        self._piece_events = 0

    def add(self, session: _Session) -> None:
        """Replay ``session`` (in the next piece)."""
        self._piece.append(session)
        self._piece_events += len(session.events) + len(session.recorded)
        if self._piece_events >= CHUNK_EVENTS:
            self._send()

    def finish(self) -> None:
        """Replay what is left and merge every outcome."""
        self._send()
        while self._pending:
            self._merge(self._pending.popleft().result())

    def _send(self) -> None:
        piece, self._piece, self._piece_events = self._piece, [], 0
        if not piece:
            return
        if self._pool is None:
            self._merge(_replay_piece(self._job, piece))
            return
        self._pending.append(self._pool.submit(_replay_piece, self._job, piece))
        while len(self._pending) >= 2 * self._workers:
            self._merge(self._pending.popleft().result())

    def __enter__(self) -> _Replayer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


class _BySession(Generic[T]):
    """The rows ``(session_id, value)`` of a cursor ordered by session id in byte order, one session at a time.

    :meth:`take` a session's values (converted); the sessions it passes over on the way, which the events
    stream did not have, go to ``skipped`` (with their ids), and so do those left at the end (:meth:`finish`).
    """

    def __init__(
        self,
        rows: Iterable[tuple[Any, ...]],
        convert: Callable[[Any], T],
        skipped: Callable[[str, list[T]], None] | None = None,
    ) -> None:
        self._groups = (
            (session_id, [convert(row[1]) for row in group])
            for session_id, group in itertools.groupby(rows, key=lambda row: str(row[0]))
        )
        self._skipped = skipped
        self._pending = next(self._groups, None)

    def take(self, session_id: str) -> list[T]:
        """The values of ``session_id`` (none if it has none); every session before it is skipped."""
        while self._pending is not None and self._pending[0] < session_id:
            self._skip()
        if self._pending is not None and self._pending[0] == session_id:
            values = self._pending[1]
            self._pending = next(self._groups, None)
            return values
        return []

    def finish(self) -> None:
        """Skip every session not taken yet."""
        while self._pending is not None:
            self._skip()

    def _skip(self) -> None:
        assert self._pending is not None
        if self._skipped is not None:
            self._skipped(*self._pending)
        self._pending = next(self._groups, None)


def _as_uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def _compare_session(
    result: RangeComparison,
    replayed: list[Sample],
    recorded: list[Sample],
    on_difference: Callable[[dict[str, Any]], None] | None,
) -> None:
    by_generation: dict[UUID, Sample] = {sample.generation_id: sample for sample in recorded}
    result.recorded += len(recorded)
    for sample in recorded:
        result.recorded_rewards.add(sample.reward)
    for sample in replayed:
        result.replayed += 1
        result.replayed_rewards.add(sample.reward)
        before = by_generation.pop(sample.generation_id, None)
        if before is None:
            result.missing_in_stream += 1
            _note(result, {"kind": "missing_in_stream", **_side("replayed", sample)}, on_difference)
            continue
        result.compared += 1
        if _same(before, sample, result.recorded_spec_hash == result.replay_spec_hash):
            result.identical += 1
            continue
        result.differing += 1
        deltas = _component_deltas(before, sample)  # only here: nearly every generation is identical
        for name, delta in deltas.items():
            result.component_deltas.setdefault(name, ComponentDelta()).add(delta)
        record = {
            "kind": "differing",
            **_side("recorded", before),
            "replayed_sample_id": sample.sample_id,
            "replayed_reward": sample.reward,
            "reward_delta": sample.reward - before.reward,
            "component_deltas": deltas,
        }
        _note(result, record, on_difference)
    for sample in by_generation.values():
        result.missing_in_replay += 1
        _note(result, {"kind": "missing_in_replay", **_side("recorded", sample)}, on_difference)


def _same(before: Sample, after: Sample, same_spec: bool) -> bool:
    if same_spec:
        return sample_to_json(before) == sample_to_json(after)
    return before.model_dump(exclude=set(_SPEC_FIELDS)) == after.model_dump(exclude=set(_SPEC_FIELDS))


def _component_deltas(before: Sample, after: Sample) -> dict[str, float]:
    names = sorted(before.components.keys() | after.components.keys())
    deltas = {name: after.components.get(name, 0.0) - before.components.get(name, 0.0) for name in names}
    return {name: delta for name, delta in deltas.items() if delta != 0.0}


def _side(prefix: str, sample: Sample) -> dict[str, Any]:
    return {
        "generation_id": str(sample.generation_id),
        "session_id": sample.session_id,
        f"{prefix}_sample_id": sample.sample_id,
        f"{prefix}_reward": sample.reward,
    }


def _note(
    result: RangeComparison, record: dict[str, Any], on_difference: Callable[[dict[str, Any]], None] | None
) -> None:
    if len(result.listed) < LISTED:
        result.listed.append(record)
    if on_difference is not None:
        on_difference(record)
