"""The overview's figures: the loop's throughput, each component's health, lag and restarts, the learner's
step and next checkpoint, the champion (since when, its reward trend) and the candidate.

Computed in the background every ``refresh_s`` (:mod:`liveloop.dashboard.snapshot`), however many browsers
poll, with the components probed in parallel and short timeouts; pages render the latest document and its
age, so neither MLflow nor a hung component ever holds a page up.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from prometheus_client import Histogram

from infra.errors import ServiceUnavailable
from infra.keeper import read_state
from infra.lag import consumer_lag
from infra.probes import http_json, http_ok
from liveloop.dashboard import store
from liveloop.dashboard.settings import ComponentProbe, DashboardSettings
from liveloop.dashboard.snapshot import Snapshot
from liveloop.models_status import models_section

TREND_VERSIONS = 10
FIRST_WAIT_S = 10.0
"""How long a page waits for the first overview after the dashboard starts; after that it says "loading"."""


def loading_document() -> dict[str, Any]:
    """The overview before its first computation has finished: every figure unknown, ``loading`` true."""
    return {
        "at": None,
        "age_s": None,
        "loading": True,
        "errors": [],
        "components": [],
        "models": {"champion": None, "candidate": None, "last_decision": None, "errors": []},
        "learner": None,
        "down": [],
        "throughput": None,
        "trend": [],
    }


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
    """The overview document (the JSON the overview page polls; its ``models`` the other pages show),
    computed in the background: :meth:`start` and :meth:`stop` belong to the app's lifespan."""

    def __init__(self, settings: DashboardSettings, dsn: str, durations: Histogram | None = None) -> None:
        self.settings = settings
        self.dsn = dsn
        self._snapshot = Snapshot(self._compute, settings.refresh_s, "overview", durations)
        self.first_wait_s = FIRST_WAIT_S

    def get(self, wait_s: float | None = None) -> dict[str, Any]:
        """The latest overview with its ``age_s``; before the first exists, wait ``wait_s`` (default
        ``first_wait_s``) for it, then :func:`loading_document`."""
        taken = self._snapshot.latest(self.first_wait_s if wait_s is None else wait_s)
        if taken is None:
            return loading_document()
        return {**taken.value, "age_s": round(taken.age_s(), 1)}

    def models(self) -> dict[str, Any]:
        """The overview's ``models`` (champion, candidate, last decision) with the read's ``age_s`` (None while
        the first read is under way), for the pages that show them beside their own figures."""
        doc = self.get()
        return {**doc["models"], "age_s": doc["age_s"]}

    def refresh(self) -> dict[str, Any]:
        """Recompute now (after an operator's action, so the next page shows its result) and return it."""
        self._snapshot.refresh()
        return self.get(wait_s=0)

    def start(self) -> None:
        """Compute now and every ``refresh_s`` in the background."""
        self._snapshot.start()

    def stop(self) -> None:
        """Stop the background computation."""
        self._snapshot.stop()

    def _compute(self) -> dict[str, Any]:
        s = self.settings
        probes = s.components
        with ThreadPoolExecutor(max_workers=max(len(probes), 1) + 1) as pool:
            states = [pool.submit(component_state, p, s.bootstrap) for p in probes]
            models = pool.submit(models_section, self.dsn, s.mlflow_url, s.model_name)
            doc: dict[str, Any] = {
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "loading": False,
                "errors": [],
            }
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
