"""Hostile input for the SQL-injection test, and what it checks the database with.

:data:`INJECTIONS` are classic injection strings (quotes, comments, stacked statements, dollar quoting,
backslashes, COPY markers, placeholders, NUL and other control characters, unicode look-alikes);
:func:`cases` puts one of them in every text field of the event contract. The database helpers make a
migrated scratch database, archive the ingest topics into it with the real archiver, and take what an
injection could change: its shape (tables, columns, functions, triggers, roles, databases) and its rows.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql
from pydantic import SecretStr

from infra.errors import ServiceUnavailable
from infra.lag import consumer_lag
from infra.migrations import migrate
from infra.stack import Endpoints
from ingest.archiver import Archiver
from ingest.settings import ArchiverSettings, IngestSettings

INJECTIONS: dict[str, str] = {
    "drop table": "'; DROP TABLE events; --",
    "or 1=1": "' OR '1'='1",
    "double quotes": '" OR ""="',
    "stacked delete": "x'); DELETE FROM promotions WHERE ('1'='1",
    "comment": "admin'/* comment */--",
    "dollar quote": "$$; DROP TABLE samples; $$",
    "tagged dollar quote": "$t$ DROP SCHEMA public CASCADE $t$",
    "backslashes": "back\\slash \\' \\\\ \\",
    "escape string": "E'\\x27; DROP TABLE checkpoints; --'",
    "COPY null marker": "\\N",
    "COPY end marker": "\\.",
    "unicode quotes": "\u2019; DROP TABLE events; -- \u02bc \uff07",
    "percent placeholders": "%s %(x)s %% %b",
    "format braces": "{} {0} {name} {{",
    "pg_sleep": "1; SELECT pg_sleep(5); --",
    "create role": "'; CREATE ROLE evil SUPERUSER LOGIN; --",
    "json breaker": '"}], "tenant": "acme", "x": [{"',
    "NUL": "a\x00b",
    "newline": "line\n'; DROP TABLE events; --",
    "tab": "col\tumn",
    "unicode controls": "\U0001f642 \U0001d54f \u202e \u200b",
    "long quotes": "'" * 120,
}
CONTROL = {name for name, s in INJECTIONS.items() if any(ord(c) < 0x20 or ord(c) == 0x7F for c in s)}
GENERATION = {"model": "tiny", "policy_version": 1, "prompt": "p", "completion": "c", "surface": "ide.tab"}


def _event(kind: str, session: str, user: str, payload: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    body = {"event_id": str(uuid.uuid4()), "type": kind, "ts": "2025-01-31T12:00:00Z", "payload": payload}
    return body | {"session_id": session, "user_id": user} | envelope


def cases(i: int, s: str) -> dict[str, list[dict[str, Any]]]:
    """The events carrying ``s`` (the ``i``-th string), by where ``s`` sits."""
    gen = [str(uuid.uuid4()) for _ in range(3)]
    envelope = [
        _event("session.started", s, s, {"surface": "ide.tab", "client": "c"}),
        _event("generation", s, s, {"generation_id": gen[0], **GENERATION}),
        _event("suggestion.accepted", s, s, {"generation_id": gen[0]}),
        _event("session.ended", s, s, {"reason": "done"}),
    ]
    names_session, texts_session = f"names-{i}", f"texts-{i}"
    started = {"surface": "ide.tab", "client": s, "client_version": s, "editor": s, "editor_version": s}
    names = [
        _event("session.started", names_session, "u", started),
        _event("generation", names_session, "u", {"generation_id": gen[1], **GENERATION, "model": s}),
        _event("tool.result", names_session, "u", {"generation_id": gen[1], "tool": s, "valid": False}),
    ]
    names[1]["payload"]["tool_calls"] = [{"name": s, "arguments": "{}"}]
    trajectory = [{"role": "user", "text": s}, {"role": "policy", "text": s}]
    texts_generation = {"generation_id": gen[2], **GENERATION, "prompt": s, "completion": s, "trajectory": trajectory}
    texts_generation["tool_calls"] = [{"name": "search", "arguments": s}]
    error = {"generation_id": gen[2], "tool": "search", "valid": False, "error": s, "call_index": 0}
    texts = [
        _event("generation", texts_session, "u", texts_generation),
        _event("tool.result", texts_session, "u", error),
        _event("session.ended", texts_session, "u", {"reason": s}),
    ]
    tenant = [_event("rating", f"tenant-{i}", "u", {"generation_id": gen[0], "thumbs": "up"}, tenant=s)]
    surface = [_event("session.started", f"surface-{i}", "u", {"surface": s, "client": "c"})]
    return {"envelope": envelope, "names": names, "texts": texts, "tenant": tenant, "surface": surface}


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a decoded JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


@contextlib.contextmanager
def scratch_database(endpoints: Endpoints) -> Iterator[str]:
    """A new database with the audit schema migrated; dropped afterwards. Yields its DSN."""
    name = f"reliability_{uuid.uuid4().hex[:12]}"
    admin = endpoints.dsn("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = endpoints.dsn(name)
        migrate(dsn)
        yield dsn
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def archive_all(endpoints: Endpoints, settings: IngestSettings, dsn: str, timeout_s: float = 90.0) -> None:
    """Run a real archiver over the ingest app's two topics until it has committed every record."""
    archiver_settings = ArchiverSettings(
        bootstrap=endpoints.kafka_bootstrap,
        dsn=SecretStr(dsn),
        events_topic=settings.events_topic,
        dlq_topic=settings.dlq_topic,
        group_id=f"reliability-archiver-{uuid.uuid4().hex[:8]}",
        batch_max_wait_s=0.2,
    )
    topics = [settings.events_topic, settings.dlq_topic]
    deadline = time.monotonic() + timeout_s

    def behind() -> bool:
        try:
            return consumer_lag(endpoints.kafka_bootstrap, archiver_settings.group_id, topics) > 0
        except ServiceUnavailable:  # e.g. the group's coordinator is not known yet on a fresh broker
            return True

    with Archiver(archiver_settings) as archiver:
        while archiver.run_once() or behind():
            assert time.monotonic() < deadline, f"the archiver did not catch up within {timeout_s} s"


def database_shape(dsn: str) -> dict[str, Any]:
    """What an injection could change besides rows: tables and columns, functions, triggers, roles, databases."""
    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT table_schema, table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema NOT IN ('pg_catalog', 'information_schema') "
            "AND table_schema NOT LIKE 'pg\\_temp\\_%' AND table_schema NOT LIKE 'pg\\_toast\\_temp\\_%' "
            "ORDER BY 1, 2, 3"
        ).fetchall()
        functions = conn.execute(
            "SELECT n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2"
        ).fetchall()
        triggers = conn.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1").fetchall()
        roles = conn.execute("SELECT rolname, rolsuper, rolcanlogin FROM pg_roles ORDER BY 1").fetchall()
        databases = conn.execute("SELECT datname FROM pg_database ORDER BY 1").fetchall()
        indexes = conn.execute(
            "SELECT schemaname, tablename, indexname FROM pg_indexes "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2, 3"
        ).fetchall()
    return {
        "columns": columns,
        "functions": functions,
        "triggers": triggers,
        "roles": roles,
        "databases": databases,
        "indexes": indexes,
    }


def row_counts(dsn: str) -> dict[str, int]:
    """Rows of every table of the public schema."""
    with psycopg.connect(dsn) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                "AND table_type = 'BASE TABLE' ORDER BY 1"
            )
        ]
        counts = {}
        for table in tables:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("public", table))).fetchone()
            assert row is not None
            counts[table] = int(row[0])
    return counts
