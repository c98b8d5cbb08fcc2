"""The distiller end to end: a real ``python -m distill.app`` worker, the real broker and database.

Each test gets its own worker (``tests/distill/stream_harness.py``): a fresh app id, fresh topics, a
fresh migrated database. Events go in through the SDK (or, for what the SDK refuses, straight to the
topic), and the assertions read what the worker wrote: ``samples``, ``late_feedback``, the samples
topic and ``/metrics``. Nothing is mocked.

Timestamps are "now" (the worker finalises by comparing event times with its wall clock), and every
session gets ids of its own, so a test never meets another test's data.
"""

from __future__ import annotations

import copy
import shutil
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from distill.replay import replay_from_database
from distill.samples import Sample, parse_sample, sample_id_for, sample_to_json
from ingest.archiver import Archiver
from ingest.events import parse_event
from ingest.settings import ArchiverSettings
from tests.distill.golden_sessions import GENERATED_AT, GENERATION_ID, GOLDEN, SESSION_ID, Golden
from tests.distill.stream_harness import (
    Json,
    MakeHarness,
    SteadyLoad,
    assert_one_sample_per_generation,
    dump_json,
    ended,
    feedback,
    generation,
    read_topic,
    simple_session,
    spec_document,
    started,
)

NAMESPACE = uuid.UUID("5d0c3f0e-7a4b-4e1f-9c52-6a8e0b1d2f37")
STREAMED_GOLDENS = [golden for golden in GOLDEN if not golden.spec_update]


def golden_stream(golden: Golden, base: datetime) -> tuple[list[Json], str, str]:
    """The golden session as a live one: ``(events, session id, generation id)``.

    Ids are derived from the golden's name (uuid5), so each golden is a session of its own and a
    repeated event id stays repeated; times keep their offsets from the generation, which is at
    ``base``; a ``session.started`` comes first and a ``session.ended`` a second after the last event.
    """

    def mapped(original: str) -> str:
        return str(uuid.uuid5(NAMESPACE, f"{golden.name}/{original}"))

    session = f"golden-{mapped(SESSION_ID)}"
    events: list[Json] = []
    last = timedelta(0)
    for original in golden.events:
        event = copy.deepcopy(original)
        offset = datetime.fromisoformat(event["ts"]) - GENERATED_AT
        last = max(last, offset)
        event["ts"] = (base + offset).isoformat().replace("+00:00", "Z")
        event["event_id"] = mapped(event["event_id"])
        event["session_id"] = f"golden-{mapped(event['session_id'])}"
        event["payload"]["generation_id"] = mapped(event["payload"]["generation_id"])
        events.append(event)
    opened = started(session, ts=base, user_id="user-1", event_id=mapped("started"))
    closed = ended(session, ts=base + last + timedelta(seconds=1), user_id="user-1", event_id=mapped("ended"))
    return [opened, *events, closed], session, mapped(GENERATION_ID)


def by_generation(samples: list[Sample]) -> dict[str, Sample]:
    """Samples keyed by generation id; fails on two samples of one generation."""
    keyed = {str(s.generation_id): s for s in samples}
    assert len(keyed) == len(samples), "two samples of one generation"
    return keyed


@pytest.mark.timeout(150)
def test_golden_sessions_through_the_stream(make_harness: MakeHarness) -> None:
    """Every golden session (default spec) sent live through the SDK gives, from the worker, exactly the
    hand-computed reward, components, counted events, invalid calls and deferral flag: the stream (with
    its session state, dedupe and late handling) scores like the pure reward function."""
    harness = make_harness(name="golden")
    harness.start()
    base = datetime.now(UTC)
    expected: dict[str, tuple[Golden, str]] = {}
    stream: list[Json] = []
    for golden in STREAMED_GOLDENS:
        events, session, generation_id = golden_stream(golden, base)
        stream += events
        expected[generation_id] = (golden, session)
    harness.emit(stream)  # the privacy-mode event of one golden is dropped by the SDK, as in production
    harness.wait_for_samples(len(expected), timeout=120)
    time.sleep(1.0)  # a stray extra sample would show up here

    samples = by_generation(harness.samples())
    assert set(samples) == set(expected), "one sample per golden generation, no other"
    for generation_id, (golden, session) in expected.items():
        sample = samples[generation_id]
        last = max(datetime.fromisoformat(e["ts"]) for e in golden.events) - GENERATED_AT
        window = timedelta(seconds=harness.spec.windows_s.longest)
        got = (sample.reward, sample.components, len(sample.source_event_ids) - 1)
        assert got == (golden.reward, golden.components, golden.counted), golden.name
        assert (sample.invalid_tool_calls, sample.deferral) == (golden.invalid_tool_calls, golden.deferral), golden.name
        assert sample.session_id == session
        assert sample.finalised_by == ("session_end" if last + timedelta(seconds=1) <= window else "window")
        assert sample.spec_hash == harness.spec.spec_hash
    assert harness.stop() == 0


@pytest.mark.timeout(330)
def test_sigkill_mid_stream_loses_nothing_and_duplicates_only_by_sample_id(make_harness: MakeHarness) -> None:
    """5,000 sessions (start, generation, accept, end); the worker is SIGKILLed in the middle of them
    and restarted. Every generation ends up with exactly one row in ``samples``; the samples topic may
    carry a sample twice (at least once), but only under the same sample id with the same bytes, so
    deduping by sample id (the learner's key) leaves exactly one sample per generation."""
    sessions = 5_000
    # Ten sessions per user: far below the per-user cap even when restarts re-publish every sample.
    harness = make_harness(name="restart")
    now = datetime.now(UTC)
    generations = [uuid.uuid5(NAMESPACE, f"restart/{i}") for i in range(sessions)]
    events = [
        event
        for i, generation_id in enumerate(generations)
        for event in simple_session(f"restart-{i}", generation_id, ts=now, user_id=f"user-{i % 500}")
    ]
    first, second = events[: len(events) * 3 // 5], events[len(events) * 3 // 5 :]
    harness.start()
    harness.emit(first)
    # In the middle: samples flow through all three agents into the database, most events are unread.
    harness.wait_until(lambda: harness.sample_count() >= sessions // 10, 240, "samples to flow")
    harness.kill()
    processed_before_kill = harness.sample_count()
    assert processed_before_kill < sessions  # two fifths of the sessions were not even sent yet
    harness.emit(second)  # arrives while no worker runs
    harness.start()
    harness.wait_ready(timeout=120)
    harness.wait_for_samples(sessions, timeout=240, stable_s=2.0)

    rows = harness.query("SELECT generation_id, count(*) FROM samples GROUP BY generation_id")
    assert {row[0] for row in rows} == set(generations)
    assert all(row[1] == 1 for row in rows)
    assert harness.sample_count() == sessions

    records = harness.topic_samples()
    ids_by_generation: dict[str, set[str]] = defaultdict(set)
    bodies: dict[str, set[bytes]] = defaultdict(set)
    for key, value in records:
        sample = parse_sample(value)
        assert key == sample.sample_id.encode(), "samples are keyed by sample id"
        ids_by_generation[str(sample.generation_id)].add(sample.sample_id)
        bodies[sample.sample_id].add(value)
    assert {len(ids) for ids in ids_by_generation.values()} == {1}, "a generation re-published under another id"
    assert {len(copies) for copies in bodies.values()} == {1}, "a re-published sample differs from the first"
    deduped = {parse_sample(value).sample_id: parse_sample(value) for _, value in records}
    assert len(deduped) == sessions
    assert {str(s.generation_id) for s in deduped.values()} == {str(g) for g in generations}
    print(
        f"\nrestart: {processed_before_kill} samples stored before SIGKILL, {len(records)} records on the "
        f"samples topic for {sessions} generations ({len(records) - sessions} re-published)"
    )
    assert harness.stop() == 0


@pytest.mark.timeout(300)
def test_a_worker_joining_and_leaving_mid_stream_loses_nothing(make_harness: MakeHarness) -> None:
    """Sessions stream in while a second worker joins the group and later leaves it: each move of
    partitions between the workers (a rebalance) hands over what was fetched but not processed and
    the tables' state, so every generation sent gets exactly one sample, under one sample id, and the
    group's committed offsets reach the end of the events.

    The worker joins within seconds of the first start, before the group committed anything on some
    partitions: that is where the records fetched and dropped by the rebalance were lost (``distill.tuning``)."""
    harness = make_harness(name="rebalance", partitions=6)
    harness.start()
    harness.wait_ready()
    load = SteadyLoad(harness, "rebalance").start()  # 100 sessions every 0.2 s, through both rebalances
    try:
        harness.wait_until(lambda: harness.sample_count() > 0, 60, "samples to flow")
        member = harness.start_member("second")
        # It joined once it has processed events of partitions the first worker gave up.
        harness.wait_until(lambda: member.metric("liveloop_distill_events_total") > 0, 120, "the member to take events")
        time.sleep(2.0)
        assert member.stop() == 0  # leaves the group: its partitions go back to the first worker
        time.sleep(2.0)
    finally:
        load.stop()
    harness.wait_for_samples(len(load.sent), timeout=180, stable_s=2.0)
    assert_one_sample_per_generation(harness, load.sent)
    assert harness.stop() == 0


@pytest.mark.timeout(150)
def test_window_timer_fires_after_a_restart(make_harness: MakeHarness) -> None:
    """A generation whose session never ends is finalised by its window even though the worker was
    stopped before the window closed and only restarted after it: the deadline lived in the table, the
    accept it got before the stop still counts, and the sample says ``finalised_by == "window"``."""
    windows = {"suggestion": 4, "edit": 6, "followup": 6, "rating": 15, "tests": 8, "tool": 6}
    harness = make_harness(name="timers", spec=spec_document(version="test-short-windows", windows_s=windows))
    assert harness.spec.windows_s.longest == 15
    harness.start()
    harness.wait_ready()
    session, generation_id = f"timer-{uuid.uuid4()}", uuid.uuid4()
    ts = datetime.now(UTC)
    deadline = ts + timedelta(seconds=harness.spec.windows_s.longest)
    before = harness.metric("liveloop_distill_events_total")
    harness.emit(
        [
            started(session, ts=ts),
            generation(session, generation_id, ts=ts),
            feedback("suggestion.accepted", session, generation_id, ts=ts + timedelta(seconds=1)),
        ]
    )
    harness.wait_until(
        lambda: harness.metric("liveloop_distill_events_total") >= before + 3, 10, "the three events to be applied"
    )
    assert harness.stop() == 0
    stopped_at = datetime.now(UTC)
    assert stopped_at < deadline, f"the worker took until {stopped_at} to stop; the window closed at {deadline}"
    assert harness.sample_count() == 0, "finalised before the window closed"

    time.sleep((deadline - datetime.now(UTC)).total_seconds() + 1.0)
    harness.start()
    harness.wait_for_samples(1, timeout=90)
    [sample] = harness.samples()
    assert str(sample.generation_id) == str(generation_id)
    assert sample.finalised_by == "window"
    assert sample.components == {"accepted": 0.75}
    assert sample.reward == 0.75
    assert harness.stop() == 0


@pytest.mark.timeout(150)
def test_a_worker_that_lost_its_local_state_rebuilds_it_from_the_changelogs(make_harness: MakeHarness) -> None:
    """The tables' changelogs hold what the local RocksDB held: after the data folder is gone, a new worker
    still knows the generation and accept a session got before (its sample counts the accept) and how
    many samples a user was admitted (the user's cap, spent before, still holds)."""
    spec = spec_document(version="test-changelog", guards={"max_samples_per_user_per_window": 1})
    harness = make_harness(name="changelog", spec=spec)
    harness.start()
    harness.wait_ready()
    ts = datetime.now(UTC)
    open_session, generation_id = f"open-{uuid.uuid4()}", uuid.uuid4()
    harness.emit(
        [
            *simple_session(f"spent-{uuid.uuid4()}", uuid.uuid4(), ts=ts, user_id="capped-user"),
            started(open_session, ts=ts),
            generation(open_session, generation_id, ts=ts),
            feedback("suggestion.accepted", open_session, generation_id, ts=ts + timedelta(seconds=1)),
        ]
    )
    harness.wait_for_samples(1)
    harness.wait_until(
        lambda: harness.metric("liveloop_distill_events_total") >= 7, 10, "the seven events to be applied"
    )
    assert harness.stop() == 0
    shutil.rmtree(harness.settings.data_dir)

    harness.start()
    harness.wait_ready()
    harness.emit(
        [
            ended(open_session, ts=ts + timedelta(seconds=2)),
            *simple_session(f"over-{uuid.uuid4()}", uuid.uuid4(), ts=ts + timedelta(seconds=3), user_id="capped-user"),
        ]
    )
    harness.wait_until(
        lambda: harness.metric("liveloop_distill_user_capped_total") >= 1, 60, "the user's second sample to be capped"
    )
    harness.wait_for_samples(2)
    by_session = {sample.session_id: sample for sample in harness.samples()}
    assert by_session[open_session].components == {"accepted": 0.75}
    assert [sample.user_id for sample in by_session.values()].count("capped-user") == 1
    assert harness.stop() == 0


@pytest.mark.timeout(120)
def test_feedback_after_session_end_is_recorded_late_and_changes_nothing(make_harness: MakeHarness) -> None:
    """An accept that arrives after its session ended (well inside its 60 s window by event time) is
    recorded in ``late_feedback`` with the final sample's id, and the sample stays as it was: silent,
    scored from the generation alone, published once."""
    harness = make_harness(name="late")
    harness.start()
    session, generation_id = f"late-{uuid.uuid4()}", uuid.uuid4()
    ts = datetime.now(UTC)
    gen = generation(session, generation_id, ts=ts)
    late = feedback("suggestion.accepted", session, generation_id, ts=ts + timedelta(seconds=3))
    harness.emit([started(session, ts=ts), gen, ended(session, ts=ts + timedelta(seconds=2)), late])
    harness.wait_for_samples(1, timeout=90)
    harness.wait_until(lambda: len(harness.late_feedback()) == 1, 30, "the late accept to be recorded")

    sample_id = sample_id_for(generation_id, harness.spec.spec_hash)
    [row] = harness.late_feedback()
    assert row == {
        "event_id": uuid.UUID(late["event_id"]),
        "generation_id": generation_id,
        "sample_id": sample_id,
        "type": "suggestion.accepted",
    }
    [sample] = harness.samples()
    assert sample.sample_id == sample_id
    assert (sample.reward, sample.components, sample.finalised_by) == (0.0, {"silent": 0.0}, "session_end")
    assert sample.source_event_ids == [uuid.UUID(gen["event_id"])]
    assert harness.metric("liveloop_distill_late_feedback_total") == 1
    # Published at least once; a repeat (the outbox is published again after a start) is the same bytes.
    assert {value for _, value in harness.topic_samples()} == {sample_to_json(sample)}
    assert harness.stop() == 0


@pytest.mark.timeout(120)
def test_invalid_tool_call_flood_is_penalised(make_harness: MakeHarness) -> None:
    """A planted flood of agent generations whose tool calls the gateway flagged invalid is penalised,
    not ignored: each gets ``invalid_tool_call = -1.0 x calls`` and a lower reward than the same
    session with valid calls, and the invalid-call counter of the policy version counts every call."""
    harness = make_harness(name="invalid")
    harness.start()
    ts = datetime.now(UTC)
    calls_invalid = [{"name": "run", "arguments": "rm -rf", "valid": False}] * 2
    calls_valid = [{"name": "read_file", "arguments": '{"path": "a.py"}', "valid": True}]
    flood: set[str] = set()
    control: set[str] = set()
    events: list[Json] = []
    for i in range(30):
        session, generation_id = f"flood-{i}-{uuid.uuid4()}", uuid.uuid4()
        calls = calls_invalid if i < 24 else calls_valid
        (flood if i < 24 else control).add(str(generation_id))
        events += [
            started(session, ts=ts, user_id=f"agent-user-{i}"),
            generation(
                session, generation_id, ts=ts, user_id=f"agent-user-{i}", surface="agent", task_kind="edit",
                completion="Done.", tool_calls=calls,
            ),
            feedback("suggestion.accepted", session, generation_id, ts=ts, user_id=f"agent-user-{i}"),
            ended(session, ts=ts, user_id=f"agent-user-{i}"),
        ]  # fmt: skip
    harness.emit(events)
    harness.wait_for_samples(30, timeout=90)

    samples = by_generation(harness.samples())
    for flooded in flood:
        sample = samples[flooded]
        assert sample.components == {"accepted": 0.75, "invalid_tool_call": -2.0}
        assert (sample.reward, sample.invalid_tool_calls) == (-1.25, 2)
    for normal in control:
        assert (samples[normal].reward, samples[normal].components) == (0.75, {"accepted": 0.75})
    assert harness.metric('liveloop_distill_invalid_tool_calls_total{policy_version="3"}') == 48
    assert harness.stop() == 0


@pytest.mark.timeout(120)
def test_one_user_sending_half_the_traffic_is_capped(make_harness: MakeHarness) -> None:
    """With ``max_samples_per_user_per_window: 5``, a user sending half of 60 sessions within the window
    gets at most 5 samples, while every other user's sample is published; the refused ones are counted."""
    cap = 5
    spec = spec_document(version="test-user-cap", guards={"max_samples_per_user_per_window": cap})
    harness = make_harness(name="usercap", spec=spec)
    harness.start()
    ts = datetime.now(UTC)
    events: list[Json] = []
    for i in range(60):
        user = "whale" if i % 2 == 0 else f"user-{i}"
        events += simple_session(f"cap-{i}-{uuid.uuid4()}", uuid.uuid4(), ts=ts + timedelta(seconds=i), user_id=user)
    harness.emit(events)

    def admitted_or_capped() -> bool:
        m = harness.metrics()
        offered = m.get("liveloop_distill_samples_scored_total", 0) + m.get(
            "liveloop_distill_samples_republished_total", 0
        )
        decided = m.get("liveloop_distill_samples_published_total", 0) + m.get("liveloop_distill_user_capped_total", 0)
        return m.get("liveloop_distill_samples_scored_total") == 60 and decided >= offered

    harness.wait_until(admitted_or_capped, 90, "every sample to be admitted or capped")
    on_topic = {key for key, _ in harness.topic_samples()}
    harness.wait_until(lambda: harness.sample_count() == len(on_topic), 30, "the published samples to be stored")

    per_user: dict[str, int] = defaultdict(int)
    for sample in harness.samples():
        per_user[sample.user_id] += 1
    whale = per_user.pop("whale")
    assert 0 < whale <= cap  # never more than the cap within the window
    assert per_user == {f"user-{i}": 1 for i in range(1, 60, 2)}
    assert harness.metric("liveloop_distill_user_capped_total") >= 30 - cap
    assert len(on_topic) == 30 + whale
    assert harness.stop() == 0


@pytest.mark.timeout(120)
def test_privacy_mode_sessions_produce_nothing(make_harness: MakeHarness) -> None:
    """A session in privacy mode (sent past the SDK, which would drop it) yields no sample, no late
    feedback and nothing on the samples topic, even with feedback after its end; so does a session that
    switches to privacy mode after its generation. A normal session next to them is distilled."""
    harness = make_harness(name="privacy")
    harness.start()
    ts = datetime.now(UTC)
    private, switched, control = (f"{kind}-{uuid.uuid4()}" for kind in ("private", "switched", "control"))
    private_gen, switched_gen, control_gen = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    after = ts + timedelta(seconds=2)
    raw: list[Json] = [
        started(private, ts=ts, privacy_mode=True),
        generation(private, private_gen, ts=ts, privacy_mode=True),
        feedback("suggestion.accepted", private, private_gen, ts=ts, privacy_mode=True),
        ended(private, ts=ts, privacy_mode=True),
        feedback("rating", private, private_gen, ts=after, thumbs="up", privacy_mode=True),  # after its end
        started(switched, ts=ts),
        generation(switched, switched_gen, ts=ts),
        feedback("suggestion.accepted", switched, switched_gen, ts=ts, privacy_mode=True),
        ended(switched, ts=ts),
        feedback("rating", switched, switched_gen, ts=after, thumbs="up"),
        *simple_session(control, control_gen, ts=ts, user_id="user-1"),
    ]
    harness.produce_raw((event["session_id"].encode(), dump_json(event)) for event in raw)
    harness.wait_for_samples(1, timeout=90)
    harness.wait_until(
        lambda: harness.metric("liveloop_distill_events_total") >= len(raw), 30, "every event to be applied"
    )
    time.sleep(1.0)

    [sample] = harness.samples()
    assert str(sample.generation_id) == str(control_gen)
    assert harness.late_feedback() == []
    assert harness.metric("liveloop_distill_privacy_dropped_total") == 8  # 5 private + 3 after the switch
    assert {parse_sample(value).session_id for _, value in harness.topic_samples()} == {control}
    assert harness.stop() == 0


@pytest.mark.timeout(180)
def test_replay_from_the_archive_matches_the_stream_bit_for_bit(make_harness: MakeHarness) -> None:
    """The archiver stores the run's events; ``replay_from_database`` re-derives every sample from them
    (leaving out the feedback the stream recorded as late) and gets the stream's samples bit for bit.
    The one generation a guard held back is reported missing in the stream, a generation that is not
    final yet is not replayed, and a stored sample altered afterwards is reported as mismatching."""
    spec = spec_document(version="test-replay", guards={"max_samples_per_session": 2})
    harness = make_harness(name="replay", spec=spec)
    harness.start()
    base = datetime.now(UTC)
    events: list[Json] = []
    for golden in STREAMED_GOLDENS:
        events += golden_stream(golden, base)[0]
    for i in range(20):
        events += simple_session(f"replay-simple-{i}", uuid.uuid4(), ts=base, user_id=f"user-{i % 3}")
    # Three generations in one session: the per-session cap of 2 holds the third back.
    capped_session, capped = "replay-capped", [uuid.uuid4() for _ in range(3)]
    events += [started(capped_session, ts=base)]
    events += [generation(capped_session, g, ts=base + timedelta(seconds=k)) for k, g in enumerate(capped)]
    events += [ended(capped_session, ts=base + timedelta(seconds=5))]
    # Feedback before its generation (an orphan), then an accept after the end (late).
    odd_session, odd_gen = "replay-odd", uuid.uuid4()
    late_accept = feedback("suggestion.accepted", odd_session, odd_gen, ts=base + timedelta(seconds=4))
    events += [
        started(odd_session, ts=base),
        feedback("rating", odd_session, odd_gen, ts=base + timedelta(seconds=2), thumbs="up"),
        generation(odd_session, odd_gen, ts=base),
        ended(odd_session, ts=base + timedelta(seconds=3)),
        late_accept,
    ]
    # A session still open: its generation is not final, in the stream or in replay.
    events += [started("replay-open", ts=base), generation("replay-open", uuid.uuid4(), ts=base)]
    harness.emit(events)
    stored = len(STREAMED_GOLDENS) + 20 + 2 + 1
    harness.wait_for_samples(stored, timeout=120)
    late_id = uuid.UUID(late_accept["event_id"])
    harness.wait_until(
        lambda: late_id in {row["event_id"] for row in harness.late_feedback()}, 30, "the late accept to be recorded"
    )
    assert harness.stop() == 0
    assert harness.sample_count() == stored

    on_topic = {str(parse_event(value).event_id) for _, value in read_topic(harness.bootstrap, harness.events_topic)}
    settings = ArchiverSettings(
        bootstrap=harness.bootstrap,
        dsn=SecretStr(harness.dsn),
        events_topic=harness.events_topic,
        dlq_topic=harness.dlq_topic,
        group_id=f"{harness.app_id}-archiver",
        batch_max_wait_s=0.2,
    )
    with Archiver(settings) as archiver:
        deadline = time.monotonic() + 60
        while harness.query("SELECT count(*) FROM events")[0][0] < len(on_topic):
            assert time.monotonic() < deadline, "the archiver did not store every event in 60 s"
            archiver.run_once()

    report = replay_from_database(harness.dsn, harness.spec, now=datetime.now(UTC))
    third = sample_id_for(capped[2], harness.spec.spec_hash)
    assert (report.matching, report.mismatching, report.missing_in_replay) == (stored, 0, 0), report.summary()
    assert (report.missing_in_stream, report.first_missing_in_stream) == (1, (third,)), report.summary()
    assert report.replayed == stored + 1

    one = replay_from_database(harness.dsn, harness.spec, session_ids=[odd_session])
    assert (one.sessions, one.replayed, one.matching) == (1, 1, 1), one.summary()
    assert one.identical
    assert not report.identical  # the capped generation is a difference too

    altered = sample_id_for(odd_gen, harness.spec.spec_hash)
    changed = harness.execute(
        "UPDATE samples SET body = jsonb_set(body, '{reward}', '1.0') WHERE sample_id = %s", (altered,)
    )
    assert changed == 1
    again = replay_from_database(harness.dsn, harness.spec, now=datetime.now(UTC))
    assert (again.mismatching, again.first_mismatching, again.matching) == (1, (altered,), stored - 1)
