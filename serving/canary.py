"""Canary routing: a sticky fraction of sessions is served by the checkpoint under evaluation.

A session is in the canary when ``session_bucket(session_id) < fraction * 10_000``; the bucket is a
stable hash of the id (sha256, not Python's salted ``hash``), so a session stays on one arm across
requests, processes and restarts. Requests without a session id always get the champion.

The router plugs into the gateway as ``router=`` (``(session_id) -> policy_version | None``; None
means the engine's default, the champion). The hot-swap controller tells it which policy version the
canary is (``set_candidate``); until then every request goes to the champion. Outcomes per arm: the
router counts routed requests per policy version (``liveloop_serving_routed_requests_total``), the
generation events carry ``policy_version``, and the gate reports the mean reward per version.
"""

from __future__ import annotations

import hashlib
import threading

from prometheus_client import CollectorRegistry, Counter

BUCKETS = 10_000


def session_bucket(session_id: str) -> int:
    """The session's bucket in ``[0, 10_000)``: the first 8 bytes of sha256(session id), mod 10_000."""
    return int.from_bytes(hashlib.sha256(session_id.encode("utf-8")).digest()[:8], "big") % BUCKETS


def in_canary(session_id: str | None, fraction: float) -> bool:
    """Whether a session belongs to the canary arm at ``fraction`` (0 = nobody, 1 = everybody)."""
    return session_id is not None and session_bucket(session_id) < round(fraction * BUCKETS)


class CanaryRouter:
    """Chooses the policy version of each request; thread-safe and cheap (one hash per request)."""

    def __init__(self, fraction: float, metrics: CollectorRegistry | None = None) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"canary fraction {fraction} is outside [0, 1]; use e.g. 0.05 for 5% of sessions")
        self.fraction = fraction
        self._candidate: int | None = None
        self._lock = threading.Lock()
        self.routed = Counter(
            "liveloop_serving_routed_requests",
            "Requests routed per arm and policy version ('default' = the engine's champion).",
            ["arm", "policy_version"],
            registry=metrics if metrics is not None else CollectorRegistry(),
        )

    @property
    def candidate(self) -> int | None:
        """The policy version serving the canary arm, or None when there is no canary."""
        return self._candidate

    def set_candidate(self, policy_version: int | None) -> None:
        """Start (a version) or stop (None) routing the canary arm to a loaded candidate."""
        with self._lock:
            self._candidate = policy_version

    def __call__(self, session_id: str | None) -> int | None:
        candidate = self._candidate  # one read: the controller may change it meanwhile
        if candidate is not None and in_canary(session_id, self.fraction):
            self.routed.labels("canary", str(candidate)).inc()
            return candidate
        self.routed.labels("champion", "default").inc()
        return None
