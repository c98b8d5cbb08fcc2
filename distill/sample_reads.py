"""Streamed reads of the recorded samples (``samples``) by the time of their generation, for export.

Like :mod:`ingest.archive_reads`: a server-side cursor, ``batch_rows`` rows per round trip, a half-open
range ``start <= generated_at < end``, and privacy-mode samples (or samples of a session with a
privacy-mode event) left out, although the distiller never records them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg

from ingest.archive_reads import BATCH_ROWS, PRIVATE_SESSIONS

EXPORT_COLUMNS = (
    *("sample_id", "generation_id", "session_id", "user_id", "tenant", "policy_version", "reward"),
    *("components", "spec_hash", "generated_at", "created_at", "body"),
)
"""The columns :func:`sample_rows` yields, in order (``components`` and ``body`` as JSON text)."""

_WHERE = f"""
    (body->>'generated_at')::timestamptz >= %(start)s AND (body->>'generated_at')::timestamptz < %(end)s
    AND (body->>'privacy_mode')::boolean IS NOT TRUE AND session_id NOT IN ({PRIVATE_SESSIONS})
"""
_ROWS = f"""
    SELECT sample_id, generation_id::text, session_id, user_id, tenant, policy_version, reward, components::text,
           spec_hash, (body->>'generated_at')::timestamptz, created_at, body::text
    FROM samples WHERE {_WHERE} ORDER BY (body->>'generated_at')::timestamptz, sample_id
"""
_COUNT = f"SELECT count(*) FROM samples WHERE {_WHERE}"


def sample_rows(
    conn: psycopg.Connection[Any], start: datetime, end: datetime, *, batch_rows: int = BATCH_ROWS
) -> Iterator[list[tuple[Any, ...]]]:
    """The samples generated in ``[start, end)``, as rows of :data:`EXPORT_COLUMNS`, in batches, by time."""
    with conn.cursor(name="recorded_sample_rows") as cursor:
        cursor.itersize = batch_rows
        cursor.execute(_ROWS, {"start": start, "end": end})
        while batch := cursor.fetchmany(batch_rows):
            yield batch


def count_samples(conn: psycopg.Connection[Any], start: datetime, end: datetime) -> int:
    """How many samples :func:`sample_rows` yields for the range."""
    row = conn.execute(_COUNT, {"start": start, "end": end}).fetchone()
    return int(row[0]) if row else 0
