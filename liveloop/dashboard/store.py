"""What the pages show, read from the audit store (PostgreSQL): checkpoints with the gate's evaluations,
the promotion history, the samples' reward by version, and the loop's throughput.

Every query is parameterised and bounded (a page of history, the checkpoints of one model), so a
page stays fast with a long-lived loop's tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

HISTORY_ACTIONS = ("promote", "rollback", "reject")


@dataclass(frozen=True)
class HistoryFilter:
    """The history page's filters; empty fields filter nothing."""

    action: str = ""
    actor: str = ""
    version: int | None = None
    before_id: int | None = None
    """Keyset pagination: rows with a smaller id (older) than this."""


def connect(dsn: str) -> psycopg.Connection[dict[str, Any]]:
    """A connection whose rows are dicts, with a short connect timeout (a page must not hang on a dead database)."""
    return psycopg.connect(dsn, connect_timeout=3, row_factory=dict_row, autocommit=True)


# The latest evaluation of each checkpoint, and its offset ranges in one line.
_CHECKPOINTS = """
SELECT c.model_version AS version, c.checkpoint_id, c.parent_id, c.policy_version, c.sample_count, c.created_at,
       c.manifest->'spec_hashes' AS spec_hashes, c.manifest->>'training_config_hash' AS config_hash,
       c.manifest->'reward' AS reward, c.manifest->>'step' AS step,
       e.decision, e.reasons, e.metrics, e.decided_at, e.champion_version,
       (SELECT string_agg(o.topic || '/' || o.kafka_partition || ':' || o.first_offset || '-' || o.last_offset,
                          ', ' ORDER BY o.topic, o.kafka_partition)
          FROM checkpoint_offsets o WHERE o.checkpoint_id = c.checkpoint_id) AS offsets
  FROM checkpoints c
  LEFT JOIN LATERAL (
       SELECT decision, reasons, metrics, decided_at, champion_version FROM evaluations ev
        WHERE ev.checkpoint_id = c.checkpoint_id ORDER BY decided_at DESC LIMIT 1) e ON true
 WHERE c.model_name = %s
"""


def checkpoints(conn: psycopg.Connection[dict[str, Any]], model_name: str) -> list[dict[str, Any]]:
    """Every checkpoint of ``model_name``, newest version first, each with its latest gate decision."""
    return conn.execute(_CHECKPOINTS + " ORDER BY c.model_version DESC NULLS LAST", (model_name,)).fetchall()


def checkpoint(conn: psycopg.Connection[dict[str, Any]], model_name: str, version: int) -> dict[str, Any] | None:
    """One checkpoint by its model version, with all its evaluations (newest first) under ``evaluations``."""
    row = conn.execute(_CHECKPOINTS + " AND c.model_version = %s", (model_name, version)).fetchone()
    if row is None:
        return None
    row["evaluations"] = conn.execute(
        "SELECT evaluation_id, champion_version, mlflow_run_id, metrics, decision, reasons, decided_at "
        "FROM evaluations WHERE checkpoint_id = %s ORDER BY decided_at DESC",
        (row["checkpoint_id"],),
    ).fetchall()
    return row


def versions(conn: psycopg.Connection[dict[str, Any]], model_name: str) -> list[int]:
    """The model versions of ``model_name``'s checkpoints, oldest first (the charts' x axis)."""
    rows = conn.execute(
        "SELECT model_version FROM checkpoints WHERE model_name = %s AND model_version IS NOT NULL "
        "ORDER BY model_version",
        (model_name,),
    ).fetchall()
    return [int(row["model_version"]) for row in rows]


def by_version(conn: psycopg.Connection[dict[str, Any]], versions: list[int]) -> list[dict[str, Any]]:
    """Per policy version of ``versions``: samples, mean reward, acceptance, and the mean of each reward component.

    Acceptance is the share of samples whose reward counted an ``accepted`` outcome; the guards
    (``invalid_tool_call``, ``deferral``) show as components, each a mean contribution per sample.
    """
    if not versions:
        return []
    rows = conn.execute(
        "SELECT policy_version AS version, count(*) AS samples, avg(reward)::float AS reward, "
        # ::float: avg of a numeric is a Decimal, which JSON (the overview's polling) would carry as a string
        "avg(CASE WHEN components ? 'accepted' THEN 1.0 ELSE 0.0 END)::float AS acceptance, "
        "min(created_at) AS first_at, max(created_at) AS last_at "
        "FROM samples WHERE policy_version = ANY(%s) GROUP BY policy_version ORDER BY policy_version",
        (versions,),
    ).fetchall()
    components = conn.execute(
        "SELECT s.policy_version AS version, c.key, sum(c.value::float) AS total "
        "FROM samples s CROSS JOIN LATERAL jsonb_each_text(s.components) c "
        "WHERE s.policy_version = ANY(%s) GROUP BY s.policy_version, c.key ORDER BY c.key",
        (versions,),
    ).fetchall()
    counts = {row["version"]: row["samples"] for row in rows}
    means: dict[int, dict[str, float]] = {}
    for c in components:
        # A sample without the component contributed 0 to it: the mean is over all the version's samples.
        means.setdefault(c["version"], {})[c["key"]] = float(c["total"]) / counts[c["version"]]
    for row in rows:
        row["components"] = means.get(row["version"], {})
    return rows


def history(
    conn: psycopg.Connection[dict[str, Any]], model_name: str, filters: HistoryFilter, limit: int
) -> list[dict[str, Any]]:
    """One page (``limit`` rows, newest first) of the promotion history that matches ``filters``."""
    where = ["model_name = %s"]
    params: list[Any] = [model_name]
    if filters.action:
        where.append("action = %s")
        params.append(filters.action)
    if filters.actor:
        where.append("actor = %s")
        params.append(filters.actor)
    if filters.version is not None:
        where.append("(from_version = %s OR to_version = %s)")
        params += [filters.version, filters.version]
    if filters.before_id is not None:
        where.append("id < %s")
        params.append(filters.before_id)
    params.append(limit)
    # The clauses are fixed strings of this module; only the values are parameters.
    query = sql.SQL(
        "SELECT id, action, from_version, to_version, actor, reason, evaluation_id, at FROM promotions "
        "WHERE {} ORDER BY id DESC LIMIT %s"
    ).format(sql.SQL(" AND ").join(sql.SQL(clause) for clause in where))
    return conn.execute(query, params).fetchall()


def since_champion(conn: psycopg.Connection[dict[str, Any]], model_name: str, version: int) -> datetime | None:
    """When ``version`` last became champion (a promote or rollback onto it), if the history says."""
    row = conn.execute(
        "SELECT at FROM promotions WHERE model_name = %s AND to_version = %s AND action IN ('promote', 'rollback') "
        "ORDER BY id DESC LIMIT 1",
        (model_name, version),
    ).fetchone()
    return row["at"] if row else None


def throughput(conn: psycopg.Connection[dict[str, Any]], window_s: int = 60) -> dict[str, float | int]:
    """Events archived and samples made per second over the last ``window_s`` seconds, and dead letters."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM events WHERE archived_at > now() - make_interval(secs => %s)) AS events, "
        "(SELECT count(*) FROM samples WHERE created_at > now() - make_interval(secs => %s)) AS samples, "
        "(SELECT count(*) FROM dead_letters) AS dead_letters, "
        "(SELECT count(*) FROM dead_letters WHERE received_at > now() - make_interval(secs => %s)) AS dead_recent",
        (window_s, window_s, window_s),
    ).fetchone()
    assert row is not None  # a SELECT without FROM always returns one row
    return {
        "events_per_s": round(row["events"] / window_s, 2),
        "samples_per_s": round(row["samples"] / window_s, 2),
        "dead_letters": int(row["dead_letters"]),
        "dead_letters_recent": int(row["dead_recent"]),
    }
