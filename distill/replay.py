"""Replay: re-derive samples from archived events with the very code the stream runs, and compare.

An auditor asks "would these events, under this spec, give the samples we trained on?". The stream
(:mod:`distill.app`) and :func:`replay_session` share every rule that decides a reward: events are
deduplicated by :func:`distill.guards.dedupe_key`, feedback is grouped by generation and scored by
:func:`distill.reward.score`, and ``finalised_by`` comes from :func:`distill.sessions.finalised_by`
with the session's ``session.ended`` event. What the stream decided by wall-clock timing (which
feedback came after its generation was final) is not re-derived but read back: the stream records
every such event in ``late_feedback``, and replay leaves exactly those out.

What replay does not re-apply, by design, are the stream's admission guards (the per-user and
per-session caps): a capped generation is replayed and reported as missing in the stream, which is
how an auditor sees how much a guard held back. Privacy-mode events are never archived, so a session
made private after some of its events were archived cannot be recognised here (the SDK drops
privacy-mode events at the source, so such a session normally never reaches the stream either).

Agent trajectories (:mod:`distill.trajectory`) are re-derived with the same pure code: a trajectory's
outcome counts unless stamped past its timeout, and one without an outcome is final by timeout. Turns the
stream received after it had finalised their trajectory were recorded late, so replay leaves them out too;
an outcome the stream dead-lettered because it had already timed the trajectory out by its wall clock (an
outcome stamped in time that arrived late) is the one case replay cannot tell apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

import psycopg

from distill.errors import DistillError
from distill.guards import dedupe_key
from distill.reward import final_at, score
from distill.samples import Sample, parse_sample, sample_to_json
from distill.sessions import finalised_by
from distill.spec import RewardSpec
from distill.trajectory import trajectory_samples
from ingest.archive_reads import archived_event
from ingest.events import Event, GenerationEvent, SessionEndedEvent, TrajectoryOutcomeEvent

LISTED = 10
"""How many sample ids of each kind of difference a report names."""


class ReplayFailed(DistillError):
    """The audit store could not be read. Check the DSN and that the database is migrated, then run again."""


def replay_session(
    events: Sequence[Event], late_event_ids: Collection[UUID], spec: RewardSpec, *, now: datetime | None = None
) -> list[Sample]:
    """The samples the stream gives for one session's events, in arrival order, under ``spec``.

    Duplicates (same tenant and event id) count once, the first copy winning; events in
    ``late_event_ids`` are left out; a session with a privacy-mode event yields nothing. Each
    generation (the first event with its ``generation_id``) is scored with the feedback that refers
    to it, and becomes final by ``session_end`` or ``window`` exactly as the stream decides. With
    ``now``, a generation of a session that has not ended and whose longest window is still open at
    ``now`` is not final yet and is left out; without it every generation counts as final.
    """
    if any(event.privacy_mode for event in events):
        return []
    seen: set[str] = set()
    generations: dict[UUID, GenerationEvent] = {}
    feedback: dict[UUID, list[Event]] = {}
    turns: dict[UUID, list[GenerationEvent]] = {}  # agent turns by trajectory, under a spec with agent credit
    outcomes: dict[UUID, TrajectoryOutcomeEvent] = {}
    ended: SessionEndedEvent | None = None
    for event in events:
        key = dedupe_key(event)
        if key in seen or event.event_id in late_event_ids:
            continue
        seen.add(key)
        if isinstance(event, SessionEndedEvent):
            ended = ended or event  # the first end finalises the generations seen so far
        elif isinstance(event, TrajectoryOutcomeEvent):
            outcomes.setdefault(event.payload.trajectory_id, event)  # the stream dead-letters any later one
        elif isinstance(event, GenerationEvent):
            if event.payload.turn is not None and spec.agent is not None:
                turns.setdefault(event.payload.turn.trajectory_id, []).append(event)
            else:
                generations.setdefault(event.payload.generation_id, event)
        else:
            generation_id: UUID | None = getattr(event.payload, "generation_id", None)
            if generation_id is not None:
                feedback.setdefault(generation_id, []).append(event)
    samples = [
        score(generation, feedback.get(generation_id, []), spec, finalised_by(generation, ended, spec))
        for generation_id, generation in generations.items()
        if ended is not None or now is None or final_at(generation, spec) <= now
    ]
    return samples + _trajectory_samples(turns, outcomes, feedback, spec, ended, now)


def _trajectory_samples(
    turns: dict[UUID, list[GenerationEvent]],
    outcomes: dict[UUID, TrajectoryOutcomeEvent],
    feedback: dict[UUID, list[Event]],
    spec: RewardSpec,
    ended: SessionEndedEvent | None,
    now: datetime | None,
) -> list[Sample]:
    """The agent samples of the session's trajectories, finalised as the stream decides by event times
    (:mod:`distill.sessions`): by the outcome unless it is stamped past the timeout, else by the timeout
    once it has passed at ``now`` (or the session ended; without ``now``, always)."""
    samples: list[Sample] = []
    for trajectory_id, trajectory in turns.items():
        assert spec.agent is not None  # turns are grouped only under a spec with agent credit
        timeout = timedelta(seconds=spec.agent.params.timeout_s)
        last_turn_at = max(turn.ts for turn in trajectory)
        outcome = outcomes.get(trajectory_id)
        if outcome is not None and outcome.ts > last_turn_at + timeout:
            outcome = None
        if outcome is None and ended is None and now is not None and last_turn_at + timeout > now:
            continue  # still open in the stream
        joined = [event for turn in trajectory for event in feedback.get(turn.payload.generation_id, [])]
        samples += trajectory_samples(trajectory, joined, outcome, spec)[1]
    return samples


@dataclass(frozen=True)
class ReplayReport:
    """How the replayed samples compare with those the stream stored (``samples.body``), bit for bit.

    ``missing_in_stream``: replayed but not stored (held back by a guard, or not final in the stream
    yet). ``missing_in_replay``: stored under this spec but not replayed (its events were not archived).
    The ``first_*`` fields name up to :data:`LISTED` sample ids of each kind, smallest first.
    """

    sessions: int
    replayed: int
    matching: int
    mismatching: int
    missing_in_stream: int
    missing_in_replay: int
    first_mismatching: tuple[str, ...]
    first_missing_in_stream: tuple[str, ...]
    first_missing_in_replay: tuple[str, ...]

    @property
    def identical(self) -> bool:
        """Whether replay and stream agree on every sample, with none missing on either side."""
        return self.matching == self.replayed and not self.missing_in_replay

    def summary(self) -> str:
        """One line for logs and assertion messages."""
        return (
            f"{self.sessions} sessions, {self.replayed} samples replayed: {self.matching} matching, "
            f"{self.mismatching} mismatching {list(self.first_mismatching)}, {self.missing_in_stream} missing in the "
            f"stream {list(self.first_missing_in_stream)}, {self.missing_in_replay} missing in replay "
            f"{list(self.first_missing_in_replay)}"
        )


# Whole literal queries, one per variant (every session, or only some): no query text is ever built
# at run time, and the session ids are always a parameter.
_EVENTS_ALL = "SELECT session_id, body::text FROM events ORDER BY session_id, kafka_partition, kafka_offset"
_EVENTS_IN_SESSIONS = (
    "SELECT session_id, body::text FROM events WHERE session_id = ANY(%(sessions)s)"
    " ORDER BY session_id, kafka_partition, kafka_offset"
)
_LATE_ALL = "SELECT l.event_id FROM late_feedback l"
_LATE_IN_SESSIONS = (
    "SELECT l.event_id FROM late_feedback l JOIN events e USING (event_id) WHERE e.session_id = ANY(%(sessions)s)"
)
_STORED_ALL = "SELECT sample_id, body::text FROM samples WHERE spec_hash = %(hash)s"
_STORED_IN_SESSIONS = (
    "SELECT sample_id, body::text FROM samples WHERE spec_hash = %(hash)s AND session_id = ANY(%(sessions)s)"
)


def replay_from_database(
    dsn: str, spec: RewardSpec, session_ids: Collection[str] | None = None, *, now: datetime | None = None
) -> ReplayReport:
    """Replay archived sessions (all, or ``session_ids``) under ``spec`` and compare with the stored samples.

    Events are read from ``events.body`` in each session's arrival order (Kafka partition and offset),
    late feedback from ``late_feedback``, and only samples stored under ``spec``'s hash are compared.
    ``now`` is passed to :func:`replay_session`. Raises :class:`ReplayFailed` if the store cannot be read.
    """
    everything = session_ids is None
    params = {"hash": spec.spec_hash, "sessions": list(session_ids or ())}
    replayed: dict[str, bytes] = {}
    sessions = 0
    try:
        with psycopg.connect(dsn) as conn:
            late = {row[0] for row in conn.execute(_LATE_ALL if everything else _LATE_IN_SESSIONS, params)}
            stored_query = _STORED_ALL if everything else _STORED_IN_SESSIONS
            stored: dict[str, str] = dict(conn.execute(stored_query, params).fetchall())
            with conn.cursor(name="replay_events") as cursor:  # server-side: sessions stream in, one at a time
                cursor.execute(_EVENTS_ALL if everything else _EVENTS_IN_SESSIONS, params)
                for _, rows in itertools.groupby(cursor, key=lambda row: row[0]):
                    sessions += 1
                    events = [archived_event(body) for _, body in rows]
                    for sample in replay_session(events, late, spec, now=now):
                        replayed[sample.sample_id] = sample_to_json(sample)
    except psycopg.Error as exc:
        raise ReplayFailed(f"reading the audit store failed: {exc}; check the DSN and run the migrations") from exc
    matching: list[str] = []
    mismatching: list[str] = []
    missing_in_stream: list[str] = []
    for sample_id, body in sorted(replayed.items()):
        if sample_id not in stored:
            missing_in_stream.append(sample_id)
        else:
            (matching if _canonical(stored[sample_id]) == body else mismatching).append(sample_id)
    missing_in_replay = sorted(set(stored) - set(replayed))
    return ReplayReport(
        sessions=sessions,
        replayed=len(replayed),
        matching=len(matching),
        mismatching=len(mismatching),
        missing_in_stream=len(missing_in_stream),
        missing_in_replay=len(missing_in_replay),
        first_mismatching=tuple(mismatching[:LISTED]),
        first_missing_in_stream=tuple(missing_in_stream[:LISTED]),
        first_missing_in_replay=tuple(missing_in_replay[:LISTED]),
    )


def stored_sample(body: str | bytes) -> Sample:
    """A sample read back from ``samples.body`` (``jsonb`` keeps no key order; ``Sample`` restores it)."""
    return parse_sample(body)


def _canonical(body: str) -> bytes:
    """A stored sample re-serialised as the stream wrote it."""
    return sample_to_json(stored_sample(body))
