"""Where the ingest API does its CPU work: inline on the event loop, or in worker processes.

Validating and redacting a batch is pure CPU (most of it in pydantic and the redaction regexes) and
holds the GIL, so one uvicorn worker uses one core at most. With ``cpu_workers > 0`` large bodies
are judged in that many spawned processes while the event loop keeps serving HTTP and Kafka; what
crosses the process boundary is the raw body in and a :class:`~ingest.api_batch.Verdict` (records
already serialised) out. Small bodies stay inline: a round trip to a worker costs more than judging
a handful of events.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from ingest.api_batch import Limits, Verdict, judge_body

OFFLOAD_MIN_BYTES = 16 * 1024
"""Bodies at least this large go to a worker process when there are any."""


def _ready() -> bool:
    return True


class Judge:
    """Runs :func:`~ingest.api_batch.judge_body` inline or in a pool of ``workers`` processes."""

    def __init__(self, limits: Limits, workers: int) -> None:
        self.limits = limits
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    async def start(self) -> None:
        """Start the worker processes (if any) and wait until each has imported the contract."""
        if not self.workers:
            return
        # Spawned, not forked: the parent runs threads (anyio, the Kafka client) that a fork would copy mid-flight.
        self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._pool, _ready) for _ in range(self.workers)))

    async def stop(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)

    async def __call__(self, raw: bytes, tenant: str) -> Verdict:
        """The verdict on one request body."""
        if self._pool is None or len(raw) < OFFLOAD_MIN_BYTES:
            return judge_body(raw, tenant, self.limits)
        return await asyncio.get_running_loop().run_in_executor(self._pool, judge_body, raw, tenant, self.limits)
