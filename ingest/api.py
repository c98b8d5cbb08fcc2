"""The HTTP ingest API: ``POST /v1/events`` puts validated, redacted events on the events topic.

For product backends that cannot embed the SDK. Run it with ``python -m ingest.api`` (settings from
``LIVELOOP_INGEST_*``; it listens on 127.0.0.1 unless told otherwise).

``POST /v1/events`` with ``Authorization: Bearer <tenant key>`` takes one event (a JSON object) or
a batch (a JSON array of events) and answers, once Kafka acknowledged every write::

    {"results": [{"index": 0, "status": "accepted", "event_id": "..."},
                 {"index": 1, "status": "accepted", "event_id": "...", "stored": false},
                 {"index": 2, "status": "rejected", "reason": "...", "field": "payload.prompt"}],
     "accepted": 2, "rejected": 1}

- 200: a batch was processed (some items may be rejected), or a single event was accepted.
- 422: a single event was rejected (same body, one result).
- 400: the body is not UTF-8, not JSON, nested too deep, or neither an object nor an array.
- 413: the body is over ``max_request_bytes`` (not read further) or the batch over ``max_batch_items``.
- 401 (with ``WWW-Authenticate: Bearer``): no key or an unknown key. Nothing is read or stored.
- 503 (with ``Retry-After``): Kafka is unavailable; nothing is reported accepted, retry the request.

Every rejected event and every rejected body is also written to the DLQ topic as a
:class:`~ingest.dead_letters.DeadLetter` with the same reason. A dead letter has no id for a retry to
reuse (events do), so a request retried after a 503 or a lost answer may leave a rejected item's dead
letter twice: nothing rejected is lost, some may be listed twice. Privacy-mode events are acknowledged
(``"stored": false``) and only counted. ``GET /healthz``, ``GET /readyz`` and ``GET /metrics`` serve
probes and Prometheus.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request, Response

from infra.credentials import load_credentials
from ingest.api_auth import ApiKeys
from ingest.api_batch import RECORD_OVERHEAD_BYTES, BodyTooLarge, Limits, dead_letter
from ingest.api_metrics import IngestMetrics
from ingest.api_openapi import document_openapi
from ingest.api_producer import EventProducer
from ingest.api_workers import Judge
from ingest.dead_letters import DeadLetter
from ingest.errors import BrokerUnavailable
from ingest.settings import IngestSettings

log = logging.getLogger(__name__)

_JSON = "application/json"


def create_app(settings: IngestSettings | None = None) -> FastAPI:
    """The ingest API app; Kafka is connected in its lifespan. Fails at once on a bad credential file."""
    settings = settings or IngestSettings()
    keys = ApiKeys(load_credentials(settings.credentials_path).ingest_keys)
    metrics = IngestMetrics()
    producer = EventProducer(
        settings.bootstrap,
        client_id=settings.client_id,
        linger_ms=settings.linger_ms,
        compression=None if settings.compression == "none" else settings.compression,
        max_batch_bytes=settings.max_message_bytes,
        timeout_s=settings.produce_timeout_s,
    )
    # Dead letters base64 their payload (4/3) and must fit a record too.
    dlq_keep = settings.max_message_bytes // 2
    limits = Limits(settings.max_batch_items, settings.max_message_bytes - RECORD_OVERHEAD_BYTES, dlq_keep)
    judge = Judge(limits, settings.cpu_workers)
    last_outage_log = 0.0

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await judge.start()
        try:
            await producer.start()
            yield
        finally:
            await producer.stop()  # delivers what is pending first
            await judge.stop()

    app = FastAPI(title="liveloop ingest API", version="1", lifespan=lifespan)

    def answer(status: int, body: object, headers: dict[str, str] | None = None) -> Response:
        return Response(json.dumps(body).encode("utf-8"), status_code=status, media_type=_JSON, headers=headers)

    def unavailable(error: BrokerUnavailable) -> Response:
        nonlocal last_outage_log
        metrics.unavailable.inc()
        now = time.monotonic()
        if now - last_outage_log > 10.0:  # one line per outage burst, not one per request
            last_outage_log = now
            log.warning("answering 503: %s", error)
        detail = f"Kafka is unavailable, nothing was accepted; retry later: {error}"
        return answer(503, {"detail": detail}, {"Retry-After": str(settings.retry_after_s)})

    def unauthorized(authorization: str | None) -> Response:
        metrics.unauthorized.inc()
        challenge = 'Bearer error="invalid_token"' if authorization else "Bearer"
        detail = "missing or unknown API key; send 'Authorization: Bearer <your tenant's ingest key>'"
        return answer(401, {"detail": detail}, {"WWW-Authenticate": challenge})

    async def reject_body(status: int, kind: str, letter: DeadLetter) -> Response:
        try:
            await producer.deliver([(settings.dlq_topic, [(letter.key(), letter.to_json())])])
        except BrokerUnavailable as exc:
            return unavailable(exc)
        metrics.rejected.labels(kind).inc()
        metrics.dead_letters.inc()
        return answer(status, {"detail": letter.reason})

    async def ingest(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        tenant = keys.tenant_for(authorization)
        if tenant is None:
            return unauthorized(authorization)
        try:
            raw = await _read_body(request, settings.max_request_bytes)
        except BodyTooLarge as exc:
            letter = dead_letter(exc.received, exc.reason, tenant=tenant, keep=dlq_keep, size=exc.size)
            return await reject_body(413, "too_large", letter)
        verdict = await judge(raw, tenant)
        if verdict.judged is None:
            assert verdict.letter is not None
            return await reject_body(verdict.status, verdict.kind, verdict.letter)
        judged = verdict.judged
        letters = [(letter.key(), letter.to_json()) for letter in judged.letters]
        try:
            await producer.deliver([(settings.events_topic, judged.records), (settings.dlq_topic, letters)])
        except BrokerUnavailable as exc:
            return unavailable(exc)
        metrics.count(judged)
        status = 200 if verdict.is_batch or judged.accepted else 422
        return Response(verdict.body, status_code=status, media_type=_JSON)

    @app.post("/v1/events")
    async def post_events(request: Request) -> Response:
        """Ingest one event or a batch of events (the body is parsed here, not by FastAPI)."""
        started = time.perf_counter()
        response = await ingest(request)
        metrics.latency.labels(str(response.status_code)).observe(time.perf_counter() - started)
        return response

    @app.get("/healthz")
    async def healthz() -> Response:
        """Liveness: the process answers."""
        return answer(200, {"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        """Readiness: Kafka is connected and both topics exist."""
        problem = await producer.problem([settings.events_topic, settings.dlq_topic])
        if problem is not None:
            return answer(503, {"ready": False, "detail": problem})
        return answer(200, {"ready": True})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus text exposition of this app's registry."""
        return Response(metrics.render(), media_type=metrics.content_type)

    if settings.enable_discard_endpoint:

        @app.post("/bench/discard", include_in_schema=False)
        async def discard(request: Request) -> Response:
            """Authenticate, read the body under the same limits, drop it: the benchmark's baseline."""
            tenant = keys.tenant_for(request.headers.get("authorization"))
            if tenant is None:
                return unauthorized(request.headers.get("authorization"))
            try:
                await _read_body(request, settings.max_request_bytes)
            except BodyTooLarge as exc:
                return answer(413, {"detail": exc.reason})
            return answer(200, {"accepted": 0})

    document_openapi(app, settings.max_batch_items)
    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with :class:`BodyTooLarge` as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        reason = (
            f"request body is {int(declared)} bytes, over the limit of {limit} (LIVELOOP_INGEST_MAX_REQUEST_BYTES); "
            "send smaller batches"
        )
        raise BodyTooLarge(reason, b"", int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            # Stop reading here: a client without Content-Length cannot make us buffer more than this.
            reason = (
                f"request body exceeds the limit of {limit} bytes (LIVELOOP_INGEST_MAX_REQUEST_BYTES); "
                "send smaller batches"
            )
            raise BodyTooLarge(reason, b"".join(chunks), size)
        chunks.append(chunk)
    return b"".join(chunks)


def main() -> None:
    """Run the API with uvicorn: one worker, warnings only, no access log (it costs per request)."""
    settings = IngestSettings()
    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, workers=1, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
