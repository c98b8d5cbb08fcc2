"""``liveloop audit``, ``replay`` and ``export`` on an audit store filled by the loop's own code (audit_data)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas
import psycopg
import pyarrow.parquet as pq
import pytest
import yaml
from psycopg import sql
from typer.testing import CliRunner

from distill import replay_range
from distill.samples import SAMPLE_SCHEMA_VERSION
from distill.spec import load_spec
from infra.settings import TopicSpec
from infra.stack import Endpoints
from infra.topics import ensure_topics
from liveloop.cli import app
from liveloop.exit_codes import PROBLEM, UNAVAILABLE, USAGE
from tests.conftest import free_port
from tests.distill.stream_harness import DEFAULT_SPEC_PATH
from tests.liveloop.audit_data import (
    END,
    HEAVY_USER,
    PRIVATE_SAMPLE_SESSION,
    PRIVATE_SESSION,
    START,
    AuditData,
    admitted,
    build,
    session_id,
)
from tests.topic_reader import read_topic

RANGE = ["--from", START.strftime("%Y-%m-%d"), "--to", END.strftime("%Y-%m-%d")]


@pytest.fixture(scope="module")
def data(endpoints: Endpoints) -> Iterator[AuditData]:
    """One filled database and samples topic for the module (building it takes a few seconds)."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = endpoints.dsn("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    topic = f"test.samples.{uuid.uuid4().hex[:12]}"
    ensure_topics(endpoints.kafka_bootstrap, [TopicSpec(name=topic, partitions=1)])
    try:
        yield build(endpoints.dsn(name), endpoints.kafka_bootstrap, topic)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _cli(data: AuditData, *args: str) -> Any:
    env = {"LIVELOOP_OPERATOR_DSN": data.dsn, "LIVELOOP_OPERATOR_BOOTSTRAP": data.bootstrap, "COLUMNS": "250"}
    return CliRunner().invoke(app, list(args), env=env)


def test_audit_checkpoint_accounts_for_exactly_what_its_offset_ranges_hold(data: AuditData) -> None:
    for manifest in data.checkpoints:
        result = _cli(data, "audit", "checkpoint", str(manifest.policy_version), "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        ranges = [(r["topic"], r["partition"], r["first_offset"], r["last_offset"]) for r in report["offset_ranges"]]
        assert ranges == [(r.topic, r.partition, r.first_offset, r.last_offset) for r in manifest.consumed]
        # What the learner's intake admits from those offset ranges, read again from the topic now.
        earlier = [
            i
            for m in data.checkpoints
            if m.policy_version < manifest.policy_version
            for i in data.trained[m.checkpoint_id]
        ]
        expected = admitted(data.bootstrap, manifest.consumed, earlier, manifest.policy_version - 1)
        assert report["trained_samples"] == report["samples"]["samples"] == len(expected) == manifest.sample_count
        assert report["trained_samples_not_stored"] == 0
        by_id = {s.sample_id: s for s in data.samples}
        trained = [by_id[i] for i in expected]
        assert report["samples"]["sessions"] == len({s.session_id for s in trained})
        assert report["samples"]["tokens"] == sum(
            len(s.prompt_token_ids or ()) + len(s.completion_token_ids or ()) for s in trained
        )
        heavy = sum(1 for s in trained if s.user_id == HEAVY_USER)
        assert report["top_users"][0] == {"user_id": HEAVY_USER, "samples": heavy}
        assert report["largest_user_share"] == pytest.approx(heavy / len(trained))
        components = {row["component"]: row["samples"] for row in report["components"]}
        assert components == {
            name: sum(1 for s in trained if name in s.components) for name in {n for s in trained for n in s.components}
        }

    # Every sample trained once, except the two the held-out rule keeps for the gate (sessions 1 and 9).
    trained_sessions = {s.session_id for s in data.samples for ids in data.trained.values() if s.sample_id in ids}
    assert {s.session_id for s in data.samples} - trained_sessions == {session_id(1), session_id(9)}

    last = json.loads(_cli(data, "audit", "checkpoint", "5", "--json").stdout)
    assert [e["decision"] for e in last["evaluations"]] == ["promote"]
    assert [(p["action"], p["actor"]) for p in last["promotions"]] == [
        ("promote", "gate"), ("rollback", "alice"), ("promote", "alice"),
    ]  # fmt: skip
    human = _cli(data, "audit", "checkpoint", "5")
    assert human.exit_code == 0, human.output
    assert "audit-policy-v00005" in human.output
    assert "top contributors" in human.output
    assert HEAVY_USER in human.output
    assert PRIVATE_SAMPLE_SESSION not in human.output

    missing = _cli(data, "audit", "checkpoint", "99")
    assert missing.exit_code == PROBLEM
    assert "no checkpoint has policy version 99" in missing.output


def test_audit_session_lists_its_events_samples_and_the_checkpoints_that_trained_on_it(data: AuditData) -> None:
    where = {i: cid for cid, ids in data.trained.items() for i in ids}
    for index in (0, 11):
        sid = session_id(index)
        result = _cli(data, "audit", "session", sid, "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["events"][0]["type"] == "session.started"
        assert len(report["events"]) == 4
        mine = [s for s in data.samples if s.session_id == sid]
        assert [s["sample_id"] for s in report["samples"]] == [s.sample_id for s in mine]
        expected = sorted({where[s.sample_id] for s in mine if s.sample_id in where})
        assert [c["checkpoint_id"] for c in report["checkpoints"]] == expected
    trained_session = next(s.session_id for s in data.samples if s.sample_id in where)
    human = _cli(data, "audit", "session", trained_session)
    assert human.exit_code == 0, human.output
    assert where[next(s.sample_id for s in data.samples if s.session_id == trained_session)] in human.output

    for private in (PRIVATE_SESSION, PRIVATE_SAMPLE_SESSION):
        hidden = _cli(data, "audit", "session", private, "--json")
        assert hidden.exit_code == PROBLEM, hidden.output
        assert "has no archived events or samples" in hidden.output


def test_replay_under_the_recorded_spec_reports_no_differences(data: AuditData, tmp_path: Path) -> None:
    result = _cli(data, "replay", *RANGE, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["no_differences"], report
    assert (
        report["counts"]["recorded"]
        == report["counts"]["replayed"]
        == report["counts"]["identical"]
        == len(data.samples)
    )
    assert report["counts"]["sessions"] == 12
    assert report["component_deltas"] == {}
    assert report["distribution"]["total_variation"] == 0.0
    assert (tmp_path / "differences.jsonl").read_text() == ""
    assert (tmp_path / "rewards.png").stat().st_size > 0
    assert "no differences" in (tmp_path / "report.md").read_text()

    one = tmp_path / "one"
    only = _cli(data, "replay", *RANGE, "--session", session_id(3), "--out", str(one))
    assert only.exit_code == 0, only.output
    counts = json.loads((one / "report.json").read_text())["counts"]
    assert (counts["sessions"], counts["recorded"], counts["identical"]) == (1, 1, 1)


def _accepted_weight_lowered(folder: Path) -> Path:
    """The default spec with the ``accepted`` weight 0.25 lower (0.75 -> 0.5: no sample reaches the clip either
    way), written into ``folder``."""
    document = yaml.safe_load(DEFAULT_SPEC_PATH.read_text())
    document["weights"]["accepted"] -= 0.25
    document["version"] = "audit-test"
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    return spec


def test_replay_with_one_weight_changed_reports_exactly_its_deltas(data: AuditData, tmp_path: Path) -> None:
    spec = _accepted_weight_lowered(tmp_path)
    result = _cli(data, "replay", *RANGE, "--spec", str(spec), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["counts"]["differing"] == data.accepted == 6
    assert report["counts"]["identical"] == len(data.samples) - data.accepted
    assert (report["counts"]["missing_in_stream"], report["counts"]["missing_in_replay"]) == (0, 0)
    assert report["component_deltas"] == {
        "accepted": {"changed": 6, "total": pytest.approx(-1.5), "mean": -0.25, "min": -0.25, "max": -0.25}
    }
    assert report["distribution"]["mean_shift"] == pytest.approx(-1.5 / len(data.samples))
    lines = [json.loads(line) for line in (tmp_path / "out" / "differences.jsonl").read_text().splitlines()]
    assert len(lines) == 6
    assert {line["session_id"] for line in lines} == {session_id(i) for i in range(0, 12, 2)}
    assert all(line["component_deltas"] == {"accepted": -0.25} for line in lines)
    assert all(line["reward_delta"] == pytest.approx(-0.25) for line in lines)
    assert PRIVATE_SAMPLE_SESSION not in (tmp_path / "out" / "report.md").read_text()


def test_replay_in_worker_processes_gives_what_one_process_gives(
    data: AuditData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three workers taking one session a piece: the same report, differences, progress and samples, in order."""
    spec = load_spec(_accepted_weight_lowered(tmp_path))
    monkeypatch.setattr(replay_range, "CHUNK_EVENTS", 1)

    def replay(workers: int) -> tuple[dict[str, Any], list[Any], list[int], list[str]]:
        differences: list[dict[str, Any]] = []
        events: list[int] = []
        samples: list[str] = []
        result = replay_range.compare_range(
            data.dsn,
            START,
            END,
            spec,
            on_difference=differences.append,
            on_session=events.append,
            on_replayed=lambda sample: samples.append(sample.sample_id),
            workers=workers,
        )
        return result.as_dict(), differences, events, samples

    alone, shared = replay(1), replay(3)
    assert len(alone[1]) == data.accepted  # differences whose order can be compared
    assert len(alone[2]) == 12  # sessions, one piece each
    assert shared[1:] == alone[1:]
    report, expected = shared[0], alone[0]
    distribution, expected_distribution = report.pop("distribution"), expected.pop("distribution")
    assert report == expected
    for side in ("recorded", "replayed"):  # merged moments: equal up to rounding
        merged, serial = distribution[side], expected_distribution[side]
        assert (merged["count"], merged["histogram"]) == (serial["count"], serial["histogram"])
        assert (merged["mean"], merged["std"]) == (pytest.approx(serial["mean"]), pytest.approx(serial["std"]))


def test_replay_publishes_to_a_replay_topic_and_refuses_the_live_one(
    data: AuditData, tmp_path: Path, make_topic: Any
) -> None:
    refused = _cli(data, "replay", *RANGE, "--out", str(tmp_path), "--publish", "liveloop.samples")
    assert refused.exit_code == USAGE
    assert "is the live samples topic" in refused.output
    topic = make_topic()
    result = _cli(data, "replay", *RANGE, "--out", str(tmp_path), "--publish", topic)
    assert result.exit_code == 0, result.output
    published = {record.key.decode() for record in read_topic(data.bootstrap, topic)}
    assert published == {s.sample_id for s in data.samples}


def test_export_is_read_by_pandas_with_postgres_row_counts(data: AuditData, tmp_path: Path) -> None:
    result = _cli(data, "export", *RANGE, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    days = sorted(p.name for p in (tmp_path / "events").iterdir())
    assert days == ["day=2026-11-02", "day=2026-11-03"]
    events = pandas.read_parquet(tmp_path / "events")
    samples = pandas.read_parquet(tmp_path / "samples")
    with psycopg.connect(data.dsn) as conn:
        stored_events = conn.execute("SELECT count(*) FROM events WHERE ts >= %s AND ts < %s", (START, END)).fetchone()
        stored_samples = conn.execute(
            "SELECT count(*) FROM samples WHERE session_id <> %s", (PRIVATE_SAMPLE_SESSION,)
        ).fetchone()
    assert stored_events is not None
    assert stored_samples is not None
    assert len(events) == stored_events[0] == data.events
    assert len(samples) == stored_samples[0] == len(data.samples)
    assert PRIVATE_SAMPLE_SESSION not in set(samples["session_id"])
    assert PRIVATE_SESSION not in set(events["session_id"])
    metadata = pq.read_schema(next((tmp_path / "samples").rglob("*.parquet"))).metadata
    assert metadata[b"liveloop.schema_version"] == str(SAMPLE_SCHEMA_VERSION).encode()
    assert metadata[b"liveloop.table"] == b"samples"

    empty = _cli(data, "export", "--from", "2026-11-04", "--to", "2026-11-03", "--out", str(tmp_path / "x"))
    assert empty.exit_code == USAGE
    assert "must be before" in empty.output


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "checkpoint", "1"],
        ["audit", "session", "s"],
        ["replay", *RANGE, "--out", "OUT"],
        ["export", *RANGE, "--out", "OUT"],
    ],
)
def test_a_store_that_does_not_answer_exits_unavailable(args: list[str], tmp_path: Path) -> None:
    dead = f"postgresql://liveloop@127.0.0.1:{free_port()}/liveloop"
    args = [str(tmp_path / "out") if arg == "OUT" else arg for arg in args]
    result = CliRunner().invoke(app, args, env={"LIVELOOP_OPERATOR_DSN": dead})
    assert result.exit_code == UNAVAILABLE, result.output
    assert "did not answer" in result.output
