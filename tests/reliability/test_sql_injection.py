"""SQL injection: every query is parameterised, and hostile text in every field is stored as text.

Two halves:

- static: :mod:`tests.reliability.query_audit` parses every module of the packages; every query
  passed to ``execute``/``executemany``/``copy``/``stream`` must be a literal or a ``psycopg.sql``
  composition (the audit's own rules are tested on small sources, so that it can fail);
- dynamic: classic injection strings go through every text field that reaches PostgreSQL: the event
  envelope (``session_id``, ``user_id``, ``tenant``) and payloads (names and free text) through the
  ingest API and a real archiver, the distiller's samples (scored from the archived events, written
  by its real sink, then replayed by session id), the operator's ``--actor``/``--reason`` through
  the real CLI, and a checkpoint's manifest texts. Afterwards the database has the same tables,
  columns, functions, triggers, roles and databases, exactly the rows written and no more, and every
  accepted value is stored verbatim; a refused one is in ``dead_letters`` with its reason.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from distill.replay import replay_from_database, replay_session
from distill.samples import HeldOutRule, Sample, sample_to_json
from distill.sink import AuditSink
from distill.spec import load_spec
from infra.registry import CHAMPION
from infra.stack import Endpoints
from ingest.events import event_to_json, parse_event
from learner.manifest import CheckpointManifest, OffsetRange, config_hash, now_utc
from learner.publish import PublishError, record_checkpoint
from serving.promotion import Promoter, PromotionError, recorded_decision
from tests.reliability.doors import ingest_door, make_credentials, operator_door
from tests.reliability.hostile import (
    CONTROL,
    INJECTIONS,
    archive_all,
    cases,
    database_shape,
    row_counts,
    scratch_database,
    strings_in,
)
from tests.reliability.profile import REPO, ReliabilityProfile
from tests.reliability.query_audit import audit, audit_source
from tests.reliability.report import markdown_table, write_section

# ------------------------------------------------------------------------------------------------- static


def test_every_query_in_the_packages_is_parameterised() -> None:
    sites, violations = audit(REPO)
    assert [str(v) for v in violations] == []
    assert len(sites) >= 50, "the audit found too few queries: is it still looking at the packages?"
    assert {site.path for site in sites} >= {"ingest/archiver.py", "distill/sink.py", "serving/promotion.py"}


SAFE_SOURCES = {
    "literal": "conn.execute('SELECT 1 FROM t WHERE a = %s', (a,))",
    "implicit concatenation": "cur.execute('SELECT 1 ' 'FROM t', ())",
    "module literal": "Q = 'SELECT 1'\ndef f(conn):\n    conn.execute(Q)",
    "local literal": "def f(conn):\n    q = ('SELECT ' 'x')\n    conn.execute(q)",
    "either literal": "def f(conn, a):\n    conn.execute('SELECT 1' if a else 'SELECT 2')",
    "sql composition": "from psycopg import sql\nconn.execute(sql.SQL('SELECT {}').format(sql.Identifier(t)))",
    "sql join": "from psycopg import sql\nQ = sql.SQL(', ').join(sql.Identifier(c) for c in cols)\ncur.copy(Q)",
    "loop over compositions": (
        "from psycopg import sql\nP = [sql.SQL('DROP TABLE {}').format(sql.Identifier(t)) for t in T]\n"
        "def f(conn):\n    for p in P:\n        conn.execute(p)"
    ),
    "placeholders": "from psycopg import sql\ncur.execute(sql.SQL('VALUES ({})').format(sql.Placeholder() * 3))",
    "not a database": "import shutil\nshutil.copy(src, dst)",
}
UNSAFE_SOURCES = {
    "f-string": "conn.execute(f'SELECT * FROM {table}')",
    "percent on str": "conn.execute('SELECT %s' % value)",
    "str.format": "conn.execute('SELECT {}'.format(value))",
    "module str.format": "Q = 'SELECT {}'\ndef f(conn, v):\n    conn.execute(Q.format(v))",
    "plus a variable": "conn.execute('SELECT * FROM ' + table)",
    "a parameter": "def f(conn, query):\n    conn.execute(query)",
    "rebound name": "Q = 'SELECT 1'\ndef f(conn, v):\n    Q = v\n    conn.execute(Q)",
    "sql.SQL of an f-string": "from psycopg import sql\nconn.execute(sql.SQL(f'SELECT {v}'))",
    "sql.SQL of a variable": "from psycopg import sql\ndef f(conn, v):\n    conn.execute(sql.SQL(v).format())",
    "keyword query": "cur.executemany(query=build(x), params_seq=[])",
    "str.join": "conn.execute(' '.join(parts))",
}


@pytest.mark.parametrize("name", list(SAFE_SOURCES))
def test_the_audit_accepts_literals_and_compositions(name: str) -> None:
    assert audit_source(SAFE_SOURCES[name]) == []


@pytest.mark.parametrize("name", list(UNSAFE_SOURCES))
def test_the_audit_reports_a_query_built_from_data(name: str) -> None:
    violations = audit_source(UNSAFE_SOURCES[name], "pkg/module.py")
    assert violations
    assert all(str(v).startswith("pkg/module.py:") for v in violations)


# ------------------------------------------------------------------------------------------------ dynamic


def _stored_events(dsn: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT event_id, session_id, user_id, tenant, body FROM events").fetchall()
    return {str(row[0]): row[1:] for row in rows}


def _stored_letters(dsn: str) -> list[tuple[str, str, str | None, bytes]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT source, reason, tenant, raw FROM dead_letters").fetchall()


def ingest_and_archive(endpoints: Endpoints, dsn: str, tmp: Path) -> dict[str, Any]:
    """Post every case through the ingest API, archive both topics; check each event's fate."""
    keys = make_credentials(tmp / "credentials.json")
    sent: dict[str, list[tuple[str, dict[str, Any], dict[str, Any]]]] = {}  # case -> (string name, event, result)
    with ingest_door(endpoints, keys) as door:
        by_case: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for i, (name, s) in enumerate(INJECTIONS.items()):
            for case, events in cases(i, s).items():
                by_case.setdefault(case, []).extend((name, event) for event in events)
        for case, items in by_case.items():
            response = door.post([event for _, event in items], f"Bearer {keys.ingest['default']}")
            assert response.status_code == 200, response.text
            results = response.json()["results"]
            sent[case] = [(name, event, result) for (name, event), result in zip(items, results, strict=True)]
        archive_all(endpoints, door.settings, dsn)
    stored, letters = _stored_events(dsn), _stored_letters(dsn)
    by_event_id = {json.loads(raw)["event_id"]: (source, reason, raw) for source, reason, _, raw in letters}
    fates: Counter[str] = Counter()
    for case, items in sent.items():
        for name, event, result in items:
            s = INJECTIONS[name]
            # What the contract allows: envelope ids and names are printable, tenant and surface are machine
            # names, and no text holds a NUL (the audit store cannot keep one).
            should_accept = "\x00" not in s and (
                case == "texts" or (case in ("envelope", "names") and name not in CONTROL)
            )
            assert (result["status"] == "accepted") == should_accept, (case, name, result)
            if result["status"] == "accepted":
                session, user, tenant, body = stored[event["event_id"]]
                assert (session, user, tenant) == (event["session_id"], event["user_id"], "default")
                assert body == json.loads(event_to_json(parse_event(event | {"tenant": "default"})))
                assert s in set(strings_in(body)) | {session, user}, (case, name)
                fates["stored verbatim"] += 1
            else:
                assert event["event_id"] not in stored
                source, reason, raw = by_event_id[event["event_id"]]
                assert (source, reason) == ("ingest-api", result["reason"].replace("\x00", "\\0"))
                assert json.loads(raw) == event  # the refused event, as it was sent
                fates[f"rejected by validation ({case})"] += 1
    assert len(stored) == fates["stored verbatim"]
    assert len(letters) == sum(fates.values()) - len(stored)
    return {"fates": dict(fates), "stored": stored}


def distill(dsn: str, stored: dict[str, tuple[Any, ...]]) -> tuple[int, int]:
    """Score the archived sessions as the stream does, store them with the distiller's sink, replay them."""
    spec = load_spec()
    sessions: dict[str, list[Any]] = {}
    with psycopg.connect(dsn) as conn:  # each session in arrival order, as the stream and replay see it
        rows = conn.execute("SELECT session_id, body FROM events ORDER BY kafka_partition, kafka_offset").fetchall()
    for session, body in rows:
        sessions.setdefault(session, []).append(parse_event(body))
    samples: list[Sample] = [s for events in sessions.values() for s in replay_session(events, (), spec)]
    expected_generations = sum(1 for _, _, _, body in stored.values() if body["type"] == "generation")
    assert len(samples) == expected_generations

    async def write() -> None:
        sink = AuditSink(dsn)
        try:
            await sink.record_spec(spec)
            await sink.write_samples(samples)
        finally:
            await sink.close()

    asyncio.run(write())
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT sample_id, session_id, user_id, tenant, body FROM samples").fetchall()
    by_id = {row[0]: row[1:] for row in rows}
    assert len(by_id) == len(samples)
    for sample in samples:
        session, user, tenant, body = by_id[sample.sample_id]
        assert (session, user, tenant) == (sample.session_id, sample.user_id, sample.tenant)
        assert body == json.loads(sample_to_json(sample))
    texts = [s for s in samples if s.session_id.startswith("texts-")]
    assert {s.prompt for s in texts} == {v for v in INJECTIONS.values() if "\x00" not in v}
    # Replay reads the archive back by session id (hostile ids as a parameter) and finds the same samples.
    report = replay_from_database(
        dsn, spec, session_ids=[s for s in sessions if not s.startswith(("names-", "texts-"))]
    )
    assert report.identical, report.summary()
    assert report.matching == len(INJECTIONS) - len(CONTROL)
    everything = replay_from_database(dsn, spec)
    assert everything.identical, everything.summary()
    assert everything.matching == len(samples)
    return len(samples), sum(len(s.source_event_ids) for s in samples)


def operate(endpoints: Endpoints, dsn: str, tmp: Path) -> int:
    """``liveloop promote`` with every string (argv cannot carry NUL) as --actor and --reason."""
    keys = make_credentials(tmp / "operator-credentials.json")
    door = operator_door(endpoints, keys, dsn, tmp, versions=2)
    expected = []
    for i, s in enumerate(v for v in INJECTIONS.values() if "\x00" not in v):
        version = 2 - i % 2
        exit_code, output = door.run(["promote", str(version), "--actor", s, "--reason", s], env_key=keys.operator)
        assert exit_code == 0, (s, output)
        expected.append(("promote", None if i == 0 else 3 - version, version, s, s))
        decided = recorded_decision(door.tags(version))
        assert (decided["by"], decided["reason"]) == (s, s)
    rows = door.history()
    assert [row[1:] for row in rows] == expected
    # In-process callers can pass NUL, which PostgreSQL text cannot hold: refused in the package's terms.
    promoter = Promoter(
        registry=door.registry, dsn=dsn, bootstrap=door.bootstrap, topic=door.topic, model_name=door.model
    )
    champion = door.alias(CHAMPION)
    with pytest.raises(PromotionError, match="NUL"):
        promoter.promote(3 - (champion or 1), actor="a\x00b", reason="nul")
    assert (door.alias(CHAMPION), door.history()) == (champion, rows)
    return len(rows)


def record_checkpoints(dsn: str) -> int:
    """The learner's audit rows of checkpoints whose manifest texts (base model, code version, topic) are hostile."""
    written = 0
    for i, s in enumerate(INJECTIONS.values()):
        manifest = CheckpointManifest(
            checkpoint_id=f"ckpt-injection-{i}",
            model_name="injection",
            base_model=s,
            policy_version=i + 1,
            step=i + 1,
            sample_count=0,
            consumed=[OffsetRange(topic=s, partition=0, first_offset=0, last_offset=1)],
            training_config_hash=config_hash({}),
            code_version=s,
            files={"model.safetensors": "0" * 64},
            created_at=now_utc(),
            held_out=HeldOutRule(percent=10),
        )
        if "\x00" in s:
            with pytest.raises(PublishError, match="NUL"):
                record_checkpoint(dsn, manifest, ())
            continue
        record_checkpoint(dsn, manifest, ())
        written += 1
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT c.base_model, c.manifest->>'code_version', o.topic FROM checkpoints c "
                "JOIN checkpoint_offsets o USING (checkpoint_id) WHERE checkpoint_id = %s",
                (manifest.checkpoint_id,),
            ).fetchone()
        assert row == (s, s, s)
    return written


@pytest.mark.timeout(300)
def test_hostile_text_in_every_field_is_stored_as_text_and_the_database_is_untouched(
    endpoints: Endpoints, tmp_path: Path, reliability: ReliabilityProfile
) -> None:
    with scratch_database(endpoints) as dsn:
        shape, counts = database_shape(dsn), row_counts(dsn)
        ingested = ingest_and_archive(endpoints, dsn, tmp_path)
        samples, lineage = distill(dsn, ingested["stored"])
        promotions = operate(endpoints, dsn, tmp_path)
        checkpoints = record_checkpoints(dsn)
        assert database_shape(dsn) == shape
        letters = sum(ingested["fates"].values()) - len(ingested["stored"])
        expected = counts | {
            "events": len(ingested["stored"]),
            "dead_letters": letters,
            "reward_specs": 1,
            "samples": samples,
            "sample_events": lineage,
            "promotions": promotions,
            "checkpoints": checkpoints,
            "checkpoint_offsets": checkpoints,
        }
        assert row_counts(dsn) == expected  # every other table as it was
    sites, violations = audit(REPO)
    fields = {
        "event envelope": "session_id, user_id, tenant",
        "session.started": "surface, client, client_version, editor, editor_version",
        "generation": "model, prompt, completion, tool_calls[].name, tool_calls[].arguments, trajectory[].text",
        "tool.result / session.ended": "tool, error / reason",
        "samples (distiller sink, replay by session id)": "session_id, user_id, tenant, body",
        "operator CLI": "--actor, --reason (promotions row, MLflow tags)",
        "checkpoint manifest": "base_model, code_version, consumed[].topic",
    }
    data = {
        "fields": fields,
        "strings": {name: repr(s) for name, s in INJECTIONS.items()},
        "fates": ingested["fates"],
        "rows": {"samples": samples, "promotions": promotions, "checkpoints": checkpoints},
        "query_sites": len(sites),
        "violations": [str(v) for v in violations],
        "allowed": [f"{s.path}:{s.line}: {s.allowed_because}" for s in sites if s.allowed_because],
    }
    markdown = (
        markdown_table(("where", "fields"), fields.items())
        + "\n"
        + markdown_table(("string", "value"), ((n, f"`{s!r}`") for n, s in INJECTIONS.items()))
        + "\n"
        + markdown_table(("fate of an event carrying one", "count"), ingested["fates"].items())
        + f"\nStatic audit: {len(sites)} query sites, {len(violations)} violations; allowed: {data['allowed']}.\n"
    )
    write_section(reliability, "sql-injection", data, markdown)
