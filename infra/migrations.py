"""A small SQL migration runner for the audit store.

Migrations are the numbered ``.sql`` files in ``infra/migrations/``, applied in order, each in its
own transaction, and recorded with a checksum in ``schema_migrations``. Running it again applies only
what is new; a recorded migration whose file has since changed is an error (edit history by adding a
migration, never by rewriting one). An advisory lock serialises concurrent runners.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from infra.errors import MigrationError, ServiceUnavailable

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# An arbitrary constant that identifies "liveloop migrations" among advisory locks.
_LOCK_KEY = 0x11E100


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every migration file, ordered by version; misnamed files are an error, not silently skipped."""
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lowercase_words.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version number in {directory}")
    return found


def migrate(dsn: str, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Bring the database at ``dsn`` up to date; return the versions applied now (empty if none)."""
    migrations = load_migrations(directory)
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"cannot reach PostgreSQL to migrate: {exc}") from exc
    applied_now: list[int] = []
    with conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
            recorded: dict[int, str] = {int(v): str(c) for v, c in rows}
            for m in migrations:
                if m.version in recorded:
                    if recorded[m.version] != m.checksum:
                        raise MigrationError(
                            f"migration {m.version:04d}_{m.name} was changed after it was applied; "
                            "restore the file and add a new migration instead"
                        )
                    continue
                try:
                    with conn.transaction():
                        conn.execute(m.sql.encode("utf-8"))
                        conn.execute(
                            "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                            (m.version, m.name, m.checksum),
                        )
                except psycopg.Error as exc:
                    raise MigrationError(f"migration {m.version:04d}_{m.name} failed: {exc}") from exc
                applied_now.append(m.version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now
