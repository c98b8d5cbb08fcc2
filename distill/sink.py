"""What the distiller writes to PostgreSQL: samples with their lineage, late feedback, the reward spec.

Every write is idempotent (``ON CONFLICT DO NOTHING`` on deterministic keys), because the distiller
delivers at least once: a sample seen twice after a crash is stored once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from psycopg_pool import AsyncConnectionPool

from distill.samples import Sample, sample_to_json
from distill.spec import RewardSpec
from ingest.events import Event


class AuditSink:
    """An async connection pool to the audit store, opened on first use."""

    def __init__(self, dsn: str) -> None:
        self._pool = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
        self._opened = False

    async def _open(self) -> AsyncConnectionPool:
        if not self._opened:
            await self._pool.open(wait=True, timeout=30)
            self._opened = True
        return self._pool

    async def close(self) -> None:
        if self._opened:
            await self._pool.close()

    async def record_spec(self, spec: RewardSpec) -> None:
        pool = await self._open()
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO reward_specs (spec_hash, version, body) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (spec.spec_hash, spec.version, spec.canonical_json().decode()),
            )

    async def write_samples(self, samples: Sequence[Sample]) -> None:
        """Store samples and their source events in one transaction."""
        if not samples:
            return
        pool = await self._open()
        rows = [
            (
                s.sample_id, s.generation_id, s.session_id, s.user_id, s.tenant, s.policy_version, s.reward,
                json.dumps(s.components), s.spec_hash, sample_to_json(s).decode(),
            )
            for s in samples
        ]  # fmt: skip
        lineage = [(s.sample_id, event_id) for s in samples for event_id in s.source_event_ids]
        async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO samples (sample_id, generation_id, session_id, user_id, tenant, policy_version,"
                " reward, components, spec_hash, body) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (sample_id) DO NOTHING",
                rows,
            )
            await cur.executemany(
                "INSERT INTO sample_events (sample_id, event_id) VALUES (%s, %s) ON CONFLICT DO NOTHING", lineage
            )

    async def record_late(self, late: Sequence[tuple[Event, str | None]]) -> None:
        """Record feedback that came after its generation was final (it changed nothing), each with the
        id of its generation's sample (``None`` when a guard held the sample back)."""
        if not late:
            return
        pool = await self._open()
        rows = []
        for event, sample_id in late:
            generation_id = str(event.payload.generation_id)  # type: ignore[union-attr]
            rows.append((event.event_id, generation_id, sample_id, event.type))
        async with pool.connection() as conn, conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO late_feedback (event_id, generation_id, sample_id, type) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (event_id) DO NOTHING",
                rows,
            )
