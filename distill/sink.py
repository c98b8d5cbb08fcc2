"""What the distiller writes to PostgreSQL: samples with their lineage, late feedback, the reward spec.

Every write is idempotent (``ON CONFLICT DO NOTHING`` on deterministic keys), because the distiller
delivers at least once: a sample seen twice after a crash is stored once. A write that fails because
the database is unreachable (a restart, a failover) is retried with back-off instead of failing the
batch: the stream waits, and nothing it has taken in is acknowledged without being stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import psycopg
from psycopg_pool import AsyncConnectionPool

from distill.errors import AuditStoreUnavailable
from distill.samples import Sample, sample_to_json
from distill.spec import RewardSpec
from ingest.events import Event

log = logging.getLogger(__name__)

RETRY_FOR_S = 300.0
"""How long a write waits for an unreachable database before the distiller gives up (and crashes)."""


# One statement: one round trip, and one transaction of its own (the pool's connections autocommit).
# The samples go in first (the CTE), then their source events; the lineage's foreign key is checked when
# the statement ends, with the samples in. A repeat of a sample (a re-delivery) may come twice in one
# batch; DO NOTHING skips the second copy.
_INSERT_SAMPLES_AND_LINEAGE = """
WITH batch AS (SELECT s FROM jsonb_array_elements(%s::jsonb) AS s),
stored AS (
    INSERT INTO samples (sample_id, generation_id, session_id, user_id, tenant, policy_version, reward, components,
                         spec_hash, body)
    SELECT s->>'sample_id', (s->>'generation_id')::uuid, s->>'session_id', s->>'user_id', s->>'tenant',
           (s->>'policy_version')::integer, (s->>'reward')::double precision, s->'components', s->>'spec_hash', s
    FROM batch
    ON CONFLICT (sample_id) DO NOTHING
)
INSERT INTO sample_events (sample_id, event_id)
SELECT s->>'sample_id', e::uuid
FROM batch, jsonb_array_elements_text(s->'source_event_ids') AS e
ON CONFLICT DO NOTHING
"""


class AuditSink:
    """An async connection pool to the audit store, opened on first use."""

    def __init__(self, dsn: str, retry_for_s: float = RETRY_FOR_S) -> None:
        # check: a connection the server dropped (a restart) is noticed when it is taken, not when it fails.
        # autocommit: every write is one statement, atomic on its own; a transaction around it cost two
        # more round trips (BEGIN, COMMIT) per batch.
        self._pool = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=4,
            open=False,
            check=AsyncConnectionPool.check_connection,
            kwargs={"autocommit": True},
        )
        self._opened = False
        self.retry_for_s = retry_for_s

    async def _retrying(self, what: str, write: Callable[[], Awaitable[None]]) -> None:
        """Run ``write`` until it succeeds; retry while the database is unreachable, at most ``retry_for_s``."""
        deadline = time.monotonic() + self.retry_for_s
        delay = 0.5
        while True:
            try:
                await write()
                return
            except psycopg.OperationalError as exc:  # connection refused or lost, pool timeout
                if time.monotonic() + delay > deadline:
                    raise AuditStoreUnavailable(
                        f"could not write {what} to PostgreSQL for {self.retry_for_s:.0f} s: {exc}"
                    ) from exc
                log.warning("writing %s: the audit store is unreachable (%s); retrying in %.1f s", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _open(self) -> AsyncConnectionPool:
        if not self._opened:
            await self._pool.open(wait=True, timeout=min(30.0, self.retry_for_s))
            self._opened = True
        return self._pool

    async def close(self) -> None:
        if self._opened:
            await self._pool.close()

    async def record_spec(self, spec: RewardSpec) -> None:
        async def write() -> None:
            pool = await self._open()
            async with pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO reward_specs (spec_hash, version, body) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                    (spec.spec_hash, spec.version, spec.canonical_json().decode()),
                )

        await self._retrying("the reward spec", write)

    async def write_samples(self, samples: Sequence[Sample]) -> None:
        """Store samples and their source events in one transaction (see :meth:`write_sample_json`)."""
        await self.write_sample_json([sample_to_json(sample) for sample in samples])

    async def write_sample_json(self, samples: Sequence[bytes]) -> None:
        """Store samples, each given as its JSON (:func:`distill.samples.sample_to_json` of a valid sample),
        and their source events, in one transaction.

        The samples go to PostgreSQL as one JSON array, which the statement takes apart (a sample's
        body is its JSON, so every column is a field of it): one statement per batch, and no binding
        of parameters row by row, which cost more of the distiller's time than anything else it did.
        """
        if not samples:
            return
        batch = (b"[" + b",".join(samples) + b"]").decode()

        async def write() -> None:
            pool = await self._open()
            async with pool.connection() as conn:
                await conn.execute(_INSERT_SAMPLES_AND_LINEAGE, (batch,))

        await self._retrying(f"{len(samples)} samples", write)

    async def record_late(self, late: Sequence[tuple[Event, str | None]]) -> None:
        """Record feedback that came after its generation was final (it changed nothing), each with the
        id of its generation's sample (``None`` when a guard held the sample back)."""
        if not late:
            return
        rows = []
        for event, sample_id in late:
            generation_id = str(event.payload.generation_id)  # type: ignore[union-attr]
            rows.append((event.event_id, generation_id, sample_id, event.type))

        async def write() -> None:
            pool = await self._open()
            async with pool.connection() as conn, conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO late_feedback (event_id, generation_id, sample_id, type) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (event_id) DO NOTHING",
                    rows,
                )

        await self._retrying(f"{len(rows)} late feedback events", write)
