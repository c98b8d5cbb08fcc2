"""The audit store's migrations: idempotent, recorded, tamper-evident, and the lineage they promise."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from infra.errors import MigrationError
from infra.migrations import MIGRATIONS_DIR, load_migrations, migrate

_SCHEMA = """
SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '')
FROM information_schema.columns WHERE table_schema = 'public' ORDER BY table_name, ordinal_position
"""
_CONSTRAINTS = """
SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2
"""
_INDEXES = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1"


def _schema(dsn: str) -> tuple[list[tuple[object, ...]], ...]:
    with psycopg.connect(dsn) as conn:
        return tuple(conn.execute(q).fetchall() for q in (_SCHEMA, _CONSTRAINTS, _INDEXES))


def test_migrations_run_twice_and_leave_the_same_schema(fresh_database: str) -> None:
    first = migrate(fresh_database)
    assert first == [m.version for m in load_migrations()] == [1, 2, 3]
    schema = _schema(fresh_database)
    tables = {row[0] for row in schema[0]}
    assert {"events", "dead_letters", "samples", "sample_events", "checkpoints", "checkpoint_offsets",
            "checkpoint_samples", "evaluations", "promotions", "late_feedback", "reward_specs"} <= tables  # fmt: skip
    indexes = {row[0] for row in schema[2]}
    assert "samples_policy_version" in indexes  # 0002: the per-version summaries' index
    assert "events_private_sessions" in indexes  # 0003: the audits' privacy filter
    assert migrate(fresh_database) == []
    assert _schema(fresh_database) == schema


def test_a_changed_migration_is_refused(fresh_database: str, tmp_path: Path) -> None:
    edited = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, edited)
    migrate(fresh_database, edited)
    first = sorted(edited.glob("*.sql"))[0]
    first.write_text(first.read_text(encoding="utf-8") + "\n-- edited\n", encoding="utf-8")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(fresh_database, edited)


def test_a_failing_migration_applies_nothing_of_itself(fresh_database: str, tmp_path: Path) -> None:
    broken = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, broken)
    (broken / "9999_broken.sql").write_text("CREATE TABLE half_done (x int);\nSELECT no_such_function();\n")
    with pytest.raises(MigrationError, match="9999_broken failed"):
        migrate(fresh_database, broken)
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT to_regclass('half_done')").fetchone() == (None,)
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert versions == [m.version for m in load_migrations()]  # every good one, none of the broken one


def test_lineage_leads_from_checkpoint_to_samples_to_events(fresh_database: str) -> None:
    migrate(fresh_database)
    with psycopg.connect(fresh_database) as conn:
        conn.execute(
            "INSERT INTO events (event_id, schema_version, type, ts, session_id, user_id, tenant,"
            " generation_id, body, kafka_partition, kafka_offset) VALUES"
            " ('00000000-0000-0000-0000-000000000001', 1, 'generation', now(), 's1', 'u1', 'default',"
            "  '00000000-0000-0000-0000-0000000000aa', '{}', 0, 0),"
            " ('00000000-0000-0000-0000-000000000002', 1, 'suggestion.accepted', now(), 's1', 'u1', 'default',"
            "  '00000000-0000-0000-0000-0000000000aa', '{}', 0, 1)"
        )
        conn.execute("INSERT INTO reward_specs VALUES ('h1', '1', '{}')")
        conn.execute(
            "INSERT INTO samples (sample_id, generation_id, session_id, user_id, tenant, policy_version, reward,"
            " components, spec_hash, body) VALUES ('smp1', '00000000-0000-0000-0000-0000000000aa', 's1', 'u1',"
            " 'default', 1, 0.75, '{\"accepted\": 0.75}', 'h1', '{}')"
        )
        conn.execute(
            "INSERT INTO sample_events VALUES ('smp1', '00000000-0000-0000-0000-000000000001'),"
            " ('smp1', '00000000-0000-0000-0000-000000000002')"
        )
        conn.execute("INSERT INTO checkpoints (checkpoint_id, policy_version, base_model, sample_count, manifest)"
                     " VALUES ('ck2', 2, 'tiny', 1, '{}')")  # fmt: skip
        conn.execute("INSERT INTO checkpoint_samples VALUES ('ck2', 'smp1')")
        conn.execute("INSERT INTO checkpoint_offsets VALUES ('ck2', 'liveloop.samples', 0, 0, 0)")
        types = conn.execute(
            "SELECT e.type FROM checkpoint_samples cs JOIN sample_events se USING (sample_id)"
            " JOIN events e USING (event_id) WHERE cs.checkpoint_id = 'ck2' ORDER BY e.kafka_offset"
        ).fetchall()
        assert types == [("generation",), ("suggestion.accepted",)]
        # A sample trains at most one checkpoint.
        conn.execute("INSERT INTO checkpoints (checkpoint_id, parent_id, policy_version, base_model, sample_count,"
                     " manifest) VALUES ('ck3', 'ck2', 3, 'tiny', 1, '{}')")  # fmt: skip
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO checkpoint_samples VALUES ('ck3', 'smp1')")
