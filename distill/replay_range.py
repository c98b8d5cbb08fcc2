"""Replay a time range of the archive and compare, generation by generation, with the recorded samples.

:func:`distill.replay.replay_session` re-derives a session's samples with the stream's own code; this
module runs it over every session with an event in ``[start, end)`` and compares each re-derived sample
with the sample the stream recorded for the same generation under the *recorded* spec. Under the recorded
spec a sample matches only bit for bit; under another spec (a new weight, say) sample ids and the spec
fields differ by construction, so a generation differs when its reward, a component, or any other field
of the sample differs.

Memory stays bounded however long the range: the archived events (:func:`ingest.archive_reads.session_events`),
the recorded samples and the feedback the stream recorded as late stream in side by side through three
server-side cursors, all ordered by session id in byte order, and are merged one session at a time.
Distributions are kept as running moments and fixed-bin histograms over the specs' clip ranges; the
differing generations go to a caller's callback (the command line writes them to a file), and only the
first :data:`distill.replay.LISTED` stay in the result.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

import psycopg

from distill.errors import AuditStoreUnavailable
from distill.replay import LISTED, ReplayFailed, replay_session, stored_sample
from distill.samples import Sample, sample_to_json
from distill.spec import RewardSpec, parse_spec
from ingest.archive_reads import BATCH_ROWS, PRIVATE_SESSIONS, SESSIONS_IN_RANGE, session_events

T = TypeVar("T")

BINS = 20
"""Bins of each reward histogram, spread evenly over the union of both specs' clip ranges."""

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
            "counts": {
                name: getattr(self, name)
                for name in ("sessions", "recorded", "replayed", "compared", "identical", "differing")
            }
            | {"missing_in_stream": self.missing_in_stream, "missing_in_replay": self.missing_in_replay},
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
) -> RangeComparison:
    """Replay the sessions with an event in ``[start, end)`` (only ``session_ids``, when given) under ``spec``
    (default: the recorded one) and compare with the samples recorded under the recorded spec.

    ``on_difference`` gets every differing generation's record, ``on_session`` the number of events of each
    session read, ``on_replayed`` every re-derived sample (to publish it). A generation whose session has not
    ended and whose windows are open at ``now`` (default: the current time) is not final and is left out.
    Raises :class:`ReplayFailed` if the store cannot be read.
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

            def unreplayed(samples: list[Sample]) -> None:
                _count_unreplayed(result, samples, on_difference)  # recorded for a session with no archived events

            with (
                conn.cursor(name="replay_stored_samples") as stored_cursor,
                conn.cursor(name="replay_late_feedback") as late_cursor,
            ):
                stored_cursor.itersize = late_cursor.itersize = batch_rows
                stored_query = _STORED if session_ids is None else _STORED_OF
                stored_cursor.execute(stored_query, {**params, "hash": recorded.spec_hash})
                late_cursor.execute(_LATE, params)
                stored = _BySession(stored_cursor, stored_sample, unreplayed)
                late = _BySession(late_cursor, _as_uuid)
                for session_id, events in session_events(conn, start, end, session_ids, batch_rows=batch_rows):
                    mine = stored.take(session_id)
                    result.sessions += 1
                    replayed = replay_session(events, set(late.take(session_id)), replay, now=moment)
                    _compare_session(result, replayed, mine, on_difference)
                    if on_replayed is not None:
                        for sample in replayed:
                            on_replayed(sample)
                    if on_session is not None:
                        on_session(len(events))
                stored.finish()
    except psycopg.OperationalError as exc:
        raise AuditStoreUnavailable(f"the audit store did not answer: {exc}; check that PostgreSQL runs") from exc
    except psycopg.Error as exc:
        raise ReplayFailed(f"reading the audit store failed: {exc}; check the DSN and run the migrations") from exc
    return result


class _BySession(Generic[T]):
    """The rows ``(session_id, value)`` of a cursor ordered by session id in byte order, one session at a time.

    :meth:`take` a session's values (converted); the sessions it passes over on the way, which the events
    stream did not have, go to ``skipped``, and so do those left at the end (:meth:`finish`).
    """

    def __init__(
        self,
        rows: Iterable[tuple[Any, ...]],
        convert: Callable[[Any], T],
        skipped: Callable[[list[T]], None] | None = None,
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
            self._skipped(self._pending[1])
        self._pending = next(self._groups, None)


def _as_uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def _count_unreplayed(
    result: RangeComparison, samples: list[Sample], on_difference: Callable[[dict[str, Any]], None] | None
) -> None:
    for sample in samples:
        result.recorded += 1
        result.missing_in_replay += 1
        result.recorded_rewards.add(sample.reward)
        _note(result, {"kind": "missing_in_replay", **_side("recorded", sample)}, on_difference)


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
