"""The overview's figures: the loop's throughput, each component's health, lag and restarts, the learner's
step and next checkpoint, the champion (since when, its reward trend) and the candidate.

Computed at most once per ``overview_cache_s`` however many browsers poll, with the components probed
in parallel and short timeouts, so a component that hangs costs the page seconds, not minutes.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from infra.errors import ServiceUnavailable
from infra.keeper import read_state
from infra.lag import consumer_lag
from infra.probes import http_json, http_ok
from liveloop.dashboard import store
from liveloop.dashboard.recent import Recent
from liveloop.dashboard.settings import ComponentProbe, DashboardSettings
from liveloop.models_status import models_section

TREND_VERSIONS = 10


def component_state(probe: ComponentProbe, bootstrap: str) -> dict[str, Any]:
    """One component's health, restarts, consumer lag and status document (each None where unknown)."""
    state: dict[str, Any] = {"name": probe.name, "healthy": None, "restarts": None, "lag": None, "details": None}
    if probe.health_url is not None:
        state["healthy"] = http_ok(probe.health_url, timeout_s=1.5)
    if probe.status_url is not None:
        state["details"] = http_json(probe.status_url, timeout_s=1.5)
    if probe.keeper_state is not None:
        keeper = read_state(probe.keeper_state)
        state["restarts"] = keeper.restarts if keeper is not None else None
    if probe.lag_group is not None:
        try:
            state["lag"] = consumer_lag(bootstrap, probe.lag_group, probe.lag_topics)
        except ServiceUnavailable:
            state["lag"] = None
    return state


class Overview:
    """Computes and caches the overview document (the JSON the overview page polls)."""

    def __init__(self, settings: DashboardSettings, dsn: str) -> None:
        self.settings = settings
        self.dsn = dsn
        self._recent = Recent(self._compute, settings.overview_cache_s)
        self.models = Recent(
            lambda: models_section(dsn, settings.mlflow_url, settings.model_name), settings.overview_cache_s
        )
        """The models section alone (champion, candidate), for the pages that show it beside their own figures."""

    def get(self) -> dict[str, Any]:
        """The latest overview, recomputed when older than ``overview_cache_s``."""
        return self._recent.get()

    def _compute(self) -> dict[str, Any]:
        s = self.settings
        probes = s.components
        with ThreadPoolExecutor(max_workers=max(len(probes), 1) + 1) as pool:
            states = [pool.submit(component_state, p, s.bootstrap) for p in probes]
            models = pool.submit(self.models.get)
            doc: dict[str, Any] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "errors": []}
            doc["components"] = [f.result() for f in states]
            doc["models"] = models.result()
        doc["errors"] += doc["models"]["errors"]
        learner = next((c["details"] for c in doc["components"] if c["name"] == "learner" and c["details"]), None)
        doc["learner"] = (
            {
                k: learner.get(k)
                for k in ("state", "step", "policy_version", "next_checkpoint_at", "samples_since_checkpoint")
            }
            if learner
            else None
        )
        doc["down"] = [c["name"] for c in doc["components"] if c["healthy"] is False]
        doc["throughput"] = None
        doc["trend"] = []
        try:
            with store.connect(self.dsn) as conn:
                doc["throughput"] = store.throughput(conn)
                champion = doc["models"]["champion"]
                if champion is not None:
                    last = champion["version"]
                    versions = list(range(max(1, last - TREND_VERSIONS + 1), last + 1))
                    doc["trend"] = [
                        {"version": r["version"], "reward": r["reward"], "acceptance": r["acceptance"]}
                        for r in store.by_version(conn, versions)
                    ]
        except psycopg.Error as exc:
            doc["errors"].append(f"postgres unavailable: {type(exc).__name__}")
        return doc
