"""The demo's live view: the loop's counters, the learner, the gate's decisions, the champion and
acceptance by version (an agent scenario: its success and efficiency figures by version, 95 % intervals),
read from the simulator, the audit store, the learner and the registry every refresh.

Every version is the one number of a checkpoint: what serving reports, the learner counts, the gate
judges and MLflow registered it under.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from rich.console import Group
from rich.table import Table

from infra.registry import CHAMPION, AliasNotSet, Registry, RegistryError
from infra.stack import Stack

if TYPE_CHECKING:
    from liveloop.demo.scenarios import ReportSpec
    from liveloop.demo.simulator.runner import Simulation


@dataclass(frozen=True)
class Watch:
    """What the live view reads every refresh, resolved once: the learner's status URL and the registry."""

    learner_status_url: str
    registry: Registry
    model_name: str

    @classmethod
    def of(cls, stack: Stack) -> Watch:
        from learner.settings import LearnerSettings
        from serving.settings import ServingSettings

        learner = LearnerSettings()
        return cls(
            learner_status_url=f"http://{learner.status_host}:{learner.status_port}/status",
            registry=Registry(stack.endpoints.mlflow_url),
            model_name=ServingSettings().model_name,
        )


def progress(stack: Stack, watch: Watch, simulation: Simulation, spec: ReportSpec | None = None) -> Group:
    """The live view: the loop's counters and acceptance by version so far (with an agent scenario's ``spec``:
    its success and efficiency figures by version instead)."""
    snapshot = simulation.snapshot()
    loop = Table("what", "now", title="liveloop demo", title_justify="left")
    elapsed = max(snapshot.duration_s, 1e-9)
    events = sum(snapshot.events.values())
    loop.add_row("events sent", f"{events:,} ({events / elapsed:.1f}/s)")
    for label, value in _database_counts(stack).items():
        loop.add_row(label, value)
    learner = _learner_status(watch.learner_status_url)
    if learner:
        loop.add_row(
            "learner",
            f"step {learner.get('step')}, version {learner.get('policy_version')}, "
            f"{learner.get('samples_since_checkpoint')} samples since its checkpoint",
        )
    loop.add_row("champion", _champion(watch))
    if spec is not None:
        return Group(loop, agent_table(spec, snapshot.agents))
    versions = Table("version", "requests", "acceptance", "95 % interval", title_justify="left")
    for item in snapshot.versions:
        low, high = item.acceptance_ci95
        versions.add_row(
            str(item.policy_version), str(item.requests), f"{item.acceptance_rate:.2f}", f"{low:.2f}-{high:.2f}"
        )
    return Group(loop, versions)


def agent_table(spec: ReportSpec, figures: list[dict[str, Any]]) -> Table:
    """An agent scenario's success and efficiency figures by policy version, each with its 95 % interval."""
    from liveloop.demo.agent_report import estimate, format_estimate

    keys = [spec.success, *(e.key for e in spec.efficiency)]
    table = Table("version", "trajectories", *keys, title_justify="left")
    for row in figures:
        cells = [format_estimate(estimate(row[key])) if isinstance(row.get(key), dict) else "-" for key in keys]
        table.add_row(str(row.get("policy_version")), str(row.get("trajectories", "")), *cells)
    return table


def _database_counts(stack: Stack) -> dict[str, str]:
    try:
        with psycopg.connect(stack.endpoints.dsn(), connect_timeout=2) as conn:
            samples = conn.execute("SELECT count(*) FROM samples").fetchone()
            checkpoints = conn.execute("SELECT count(*) FROM checkpoints WHERE parent_id IS NOT NULL").fetchone()
            decisions = conn.execute(
                "SELECT c.policy_version, e.decision FROM evaluations e "
                "JOIN checkpoints c USING (checkpoint_id) ORDER BY e.decided_at"
            ).fetchall()
    except psycopg.Error:
        return {}
    return {
        "samples": f"{samples[0] if samples else 0:,}",
        "checkpoints": str(checkpoints[0] if checkpoints else 0),
        "gate decisions": ", ".join(f"version {version}: {decision}" for version, decision in decisions) or "none yet",
    }


def _learner_status(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - an http URL built from settings
            status: dict[str, Any] = json.loads(response.read())
            return status
    except (OSError, ValueError):
        return {}


def _champion(watch: Watch) -> str:
    try:
        version = watch.registry.version_by_alias(watch.model_name, CHAMPION)
    except (AliasNotSet, RegistryError):
        return "none"
    return f"version {version.version}"
