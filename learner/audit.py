"""Lineage for audits: a checkpoint back to its samples, generations and sessions; a session forward to the
checkpoints that trained on it. Read from the audit store, aggregated in SQL so that a checkpoint of a
million samples is summarised without loading them.

What a checkpoint trained on is ``checkpoint_samples`` (written with the manifest by
:func:`learner.publish.record_checkpoint`: exactly the samples the learner's intake admitted from the
manifest's offset ranges). Samples of privacy-mode sessions are never trained on; should a row of one exist
anyway (an older distiller), every read here leaves it out rather than show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from learner.errors import LearnerError

TOP_CONTRIBUTORS = 5
"""How many users a checkpoint audit names, largest contribution first."""

_NOT_PRIVATE = (
    "(s.body->>'privacy_mode')::boolean IS NOT TRUE AND s.session_id NOT IN "
    "(SELECT session_id FROM events WHERE (body->>'privacy_mode')::boolean IS TRUE)"
)
_CHECKPOINT = (
    "SELECT checkpoint_id, parent_id, policy_version, base_model, sample_count, model_name, model_version, created_at,"
    " manifest->'spec_hashes' AS spec_hashes FROM checkpoints WHERE policy_version = %(version)s"
)
_OFFSETS = (
    "SELECT topic, kafka_partition AS partition, first_offset, last_offset FROM checkpoint_offsets"
    " WHERE checkpoint_id = %(id)s ORDER BY topic, kafka_partition"
)
_SAMPLES = f"""
    SELECT count(*) AS samples, count(DISTINCT s.generation_id) AS generations,
           count(DISTINCT s.session_id) AS sessions, count(DISTINCT s.user_id) AS users,
           coalesce(sum(jsonb_array_length(coalesce(s.body->'prompt_token_ids', '[]'))
                      + jsonb_array_length(coalesce(s.body->'completion_token_ids', '[]'))), 0) AS tokens,
           avg(s.reward) AS reward_mean, stddev_pop(s.reward) AS reward_std,
           min(s.reward) AS reward_min, max(s.reward) AS reward_max
    FROM checkpoint_samples c JOIN samples s USING (sample_id) WHERE c.checkpoint_id = %(id)s AND {_NOT_PRIVATE}
"""
_TRAINED = "SELECT count(*) FROM checkpoint_samples WHERE checkpoint_id = %(id)s"
_NOT_STORED = (
    "SELECT count(*) FROM checkpoint_samples c WHERE c.checkpoint_id = %(id)s"
    " AND NOT EXISTS (SELECT 1 FROM samples s WHERE s.sample_id = c.sample_id)"
)
_COMPONENTS = f"""
    SELECT key AS component, count(*) AS samples, avg(value::double precision) AS mean,
           stddev_pop(value::double precision) AS std, min(value::double precision) AS min,
           max(value::double precision) AS max
    FROM checkpoint_samples c JOIN samples s USING (sample_id), jsonb_each_text(s.components)
    WHERE c.checkpoint_id = %(id)s AND {_NOT_PRIVATE} GROUP BY key ORDER BY key
"""
_USERS = f"""
    SELECT s.user_id AS user_id, count(*) AS samples FROM checkpoint_samples c JOIN samples s USING (sample_id)
    WHERE c.checkpoint_id = %(id)s AND {_NOT_PRIVATE} GROUP BY s.user_id ORDER BY count(*) DESC, s.user_id
    LIMIT %(top)s
"""
_SESSION_EVENTS = """
    SELECT event_id::text, type, ts, generation_id::text, policy_version, kafka_partition AS partition,
           kafka_offset AS offset
    FROM events WHERE session_id = %(session)s ORDER BY kafka_partition, kafka_offset
"""
_SESSION_PRIVATE = (
    "SELECT EXISTS (SELECT 1 FROM events WHERE session_id = %(session)s AND (body->>'privacy_mode')::boolean IS TRUE)"
    " OR EXISTS (SELECT 1 FROM samples WHERE session_id = %(session)s AND (body->>'privacy_mode')::boolean IS TRUE)"
)
_SESSION_SAMPLES = """
    SELECT s.sample_id, s.generation_id::text, s.reward, s.components, s.spec_hash, s.policy_version,
           c.checkpoint_id, k.policy_version AS checkpoint_version
    FROM samples s LEFT JOIN checkpoint_samples c USING (sample_id) LEFT JOIN checkpoints k USING (checkpoint_id)
    WHERE s.session_id = %(session)s ORDER BY s.created_at, s.sample_id
"""


class AuditNotFound(LearnerError):
    """The checkpoint or session asked for is not in the audit store: check the number or id (and the DSN)."""


class AuditStoreError(LearnerError):
    """The audit store could not be read: check the DSN and that the database is migrated."""


@dataclass(frozen=True)
class CheckpointLineage:
    """A checkpoint, the offset ranges it consumed and a summary of the samples it trained on."""

    checkpoint: dict[str, Any]
    offsets: list[dict[str, Any]]
    trained: int
    not_stored: int
    samples: dict[str, Any]
    components: list[dict[str, Any]]
    top_users: list[dict[str, Any]]

    @property
    def largest_user_share(self) -> float:
        """The share of the checkpoint's samples from its largest contributor (a flood shows up here)."""
        total = int(self.samples["samples"] or 0)
        return self.top_users[0]["samples"] / total if total and self.top_users else 0.0


@dataclass(frozen=True)
class SessionLineage:
    """A session's archived events, its samples, and the checkpoints that trained on them."""

    session_id: str
    events: list[dict[str, Any]]
    samples: list[dict[str, Any]]

    @property
    def checkpoints(self) -> list[dict[str, Any]]:
        """The checkpoints that trained on this session's samples, by version, each with how many it took."""
        taken: dict[tuple[int, str], int] = {}
        for sample in self.samples:
            if sample["checkpoint_id"] is not None:
                key = (int(sample["checkpoint_version"]), str(sample["checkpoint_id"]))
                taken[key] = taken.get(key, 0) + 1
        return [
            {"policy_version": version, "checkpoint_id": checkpoint_id, "samples": count}
            for (version, checkpoint_id), count in sorted(taken.items())
        ]


def checkpoint_lineage(conn: psycopg.Connection[Any], policy_version: int) -> CheckpointLineage:
    """The lineage of the checkpoint whose policy version (= MLflow model version) is ``policy_version``."""
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            checkpoint = cur.execute(_CHECKPOINT, {"version": policy_version}).fetchone()
            if checkpoint is None:
                raise AuditNotFound(f"no checkpoint has policy version {policy_version} in the audit store")
            key = {"id": checkpoint["checkpoint_id"], "top": TOP_CONTRIBUTORS}
            offsets = cur.execute(_OFFSETS, key).fetchall()
            samples = cur.execute(_SAMPLES, key).fetchone() or {}
            components = cur.execute(_COMPONENTS, key).fetchall()
            users = cur.execute(_USERS, key).fetchall()
        trained = conn.execute(_TRAINED, key).fetchone()
        not_stored = conn.execute(_NOT_STORED, key).fetchone()
    except psycopg.Error as exc:
        raise AuditStoreError(f"reading checkpoint {policy_version} from the audit store failed: {exc}") from exc
    return CheckpointLineage(
        checkpoint=_plain(checkpoint),
        offsets=offsets,
        trained=int(trained[0]) if trained else 0,
        not_stored=int(not_stored[0]) if not_stored else 0,
        samples=_plain(samples),
        components=[_plain(row) for row in components],
        top_users=users,
    )


def session_lineage(conn: psycopg.Connection[Any], session_id: str) -> SessionLineage:
    """Every archived event of ``session_id``, its samples and the checkpoints they trained.

    A privacy-mode session is reported as not found: nothing of it is shown, not even that it exists.
    """
    params = {"session": session_id}
    try:
        private = conn.execute(_SESSION_PRIVATE, params).fetchone()
        with conn.cursor(row_factory=dict_row) as cur:
            events = [] if private and private[0] else cur.execute(_SESSION_EVENTS, params).fetchall()
            samples = [] if private and private[0] else cur.execute(_SESSION_SAMPLES, params).fetchall()
    except psycopg.Error as exc:
        raise AuditStoreError(f"reading session {session_id!r} from the audit store failed: {exc}") from exc
    if not events and not samples:
        raise AuditNotFound(f"session {session_id!r} has no archived events or samples in the audit store")
    return SessionLineage(
        session_id=session_id, events=[_plain(row) for row in events], samples=[_plain(row) for row in samples]
    )


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row with JSON-ready values: times as ISO text, decimals as floats."""
    return {key: value.isoformat() if isinstance(value, datetime) else _number(value) for key, value in row.items()}


def _number(value: Any) -> Any:
    from decimal import Decimal

    return float(value) if isinstance(value, Decimal) else value
