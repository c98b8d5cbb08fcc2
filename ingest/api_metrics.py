"""Prometheus metrics of the HTTP ingest API, in a registry of their own per app.

A registry per app (not the process-wide default) lets tests and benchmarks run several apps in one
process without "duplicated timeseries" errors. Counters are bumped once per request with the
request's totals, never once per event: the hot path stays free of per-event bookkeeping.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from ingest.api_batch import Judgement

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class IngestMetrics:
    """The API's counters and its request latency histogram."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.accepted = Counter(
            "liveloop_ingest_events_accepted",
            "Events written to the events topic and acknowledged by Kafka.",
            registry=r,
        )
        self.rejected = Counter(
            "liveloop_ingest_events_rejected",
            "Rejected events (or whole bodies), by reason class: malformed, too_large, unsupported_schema_version, "
            "invalid, tenant_mismatch, duplicate.",
            ["reason"],
            registry=r,
        )
        self.privacy_dropped = Counter(
            "liveloop_ingest_events_privacy_dropped",
            "Privacy-mode events acknowledged and dropped, never written anywhere.",
            registry=r,
        )
        self.redactions = Counter(
            "liveloop_ingest_redactions", "Secrets redacted from accepted events, by kind.", ["kind"], registry=r
        )
        self.dead_letters = Counter(
            "liveloop_ingest_dead_letters", "Dead letters written to the DLQ topic.", registry=r
        )
        self.unauthorized = Counter(
            "liveloop_ingest_unauthorized_requests", "Requests refused for a missing or unknown API key.", registry=r
        )
        self.unavailable = Counter(
            "liveloop_ingest_unavailable_responses", "Requests answered 503 because Kafka was unavailable.", registry=r
        )
        self.latency = Histogram(
            "liveloop_ingest_request_seconds",
            "Time to answer POST /v1/events, by HTTP status code.",
            ["code"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def count(self, judged: Judgement) -> None:
        """Count one request's outcome; called only once its writes were acknowledged."""
        stored = judged.accepted - judged.privacy_dropped
        if stored:
            self.accepted.inc(stored)
        if judged.privacy_dropped:
            self.privacy_dropped.inc(judged.privacy_dropped)
        for kind, n in judged.rejected_by_class.items():
            self.rejected.labels(kind).inc(n)
        for kind, n in judged.redactions.items():
            self.redactions.labels(kind).inc(n)
        if judged.letters:
            self.dead_letters.inc(len(judged.letters))

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
