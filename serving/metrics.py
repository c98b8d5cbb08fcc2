"""Prometheus metrics of the gateway, in a registry of their own per app.

A registry per app (not the process-wide default) lets tests and benchmarks run several gateways in
one process. Token and generation counters carry the policy version, so a canary's share of the
traffic and its output lengths show next to the champion's.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GatewayMetrics:
    """Requests, latency, tokens and generations per policy version, emission failures."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # A shared registry lets the swap controller's and canary's metrics appear on the same /metrics.
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "liveloop_gateway_requests",
            "Requests answered, by endpoint and HTTP status code.",
            ["endpoint", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "liveloop_gateway_request_seconds",
            "Time to answer a /v1 request (the whole stream for streaming ones), by endpoint.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.generations = Counter(
            "liveloop_gateway_generations",
            "Completions served (one per choice), by policy version.",
            ["policy_version"],
            registry=r,
        )
        self.tokens = Counter(
            "liveloop_gateway_tokens",
            "Tokens processed, by kind (prompt or completion) and policy version.",
            ["kind", "policy_version"],
            registry=r,
        )
        self.emit_failures = Counter(
            "liveloop_gateway_emit_failures",
            "Generation events that could not be handed to the ingest SDK (the response was served anyway).",
            registry=r,
        )
        self.in_flight = Gauge("liveloop_gateway_in_flight_requests", "Requests being served now.", registry=r)

    def count_generation(self, policy_version: int, prompt_tokens: int, completion_tokens: int) -> None:
        """Count one served completion."""
        version = str(policy_version)
        self.generations.labels(version).inc()
        self.tokens.labels("prompt", version).inc(prompt_tokens)
        self.tokens.labels("completion", version).inc(completion_tokens)

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
