"""The local stack: Kafka, PostgreSQL and MLflow, plus the loop's own components, as one unit.

``Stack.up`` starts whatever is not running and waits until everything is healthy; ``down`` stops
everything it started, components first; ``status`` reports each service and component with its
address and health. A service whose external address is configured is used, never started.
Components (the stages' processes) are registered by the caller as ``ComponentSpec``s, which keeps
this floor unaware of what runs above it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from infra.credentials import DevCredentials, ensure_credentials, existing_credentials
from infra.errors import ServiceStartError, ServiceUnavailable
from infra.kafka_broker import KafkaCluster, kafka_answers
from infra.keeper import read_state
from infra.lag import consumer_lag
from infra.migrations import migrate
from infra.mlflow_server import MlflowServer, mlflow_answers
from infra.postgres import LocalPostgres, find_pg_bin, postgres_answers
from infra.probes import http_json, http_ok
from infra.processes import ManagedProcess, wait_until
from infra.settings import Replication, StackSettings, TopicsSettings
from infra.topics import ensure_topics


class Endpoints(BaseModel):
    """How clients reach the stack's services."""

    kafka_bootstrap: str
    postgres_dsn: SecretStr
    mlflow_url: str

    def dsn(self, database: str | None = None) -> str:
        """The PostgreSQL DSN (revealed), optionally for another database on the same server."""
        dsn = self.postgres_dsn.get_secret_value()
        if database is None:
            return dsn
        return dsn.rsplit("/", 1)[0] + "/" + database


@dataclass(frozen=True)
class ComponentSpec:
    """A long-running process of the loop (ingest API, distiller, ...) that ``up`` starts and supervises."""

    name: str
    argv: Sequence[str]
    health_url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    lag_group: str | None = None
    lag_topics: Sequence[str] = ()
    restart: bool = True
    """Run under :mod:`infra.keeper`, which restarts the process with back-off whenever it dies."""
    status_url: str | None = None
    """A JSON status document (the learner's step, pending samples...) that ``status`` includes as ``details``."""
    clear_env: Sequence[str] = ()
    """Variables of ``up``'s environment the component must not inherit (e.g. another job's rendezvous)."""


class Stack:
    """The local services and components described by ``StackSettings``."""

    def __init__(
        self,
        settings: StackSettings | None = None,
        topics: TopicsSettings | None = None,
        *,
        create_credentials: bool = True,
    ) -> None:
        """``create_credentials=False`` is for commands that only look at or stop a stack (``status``,
        ``down``): they read its credential file and never write one, so keys are minted only by the
        command that starts the stack."""
        self.settings = settings or StackSettings()
        self.topics = topics or TopicsSettings()
        self.credentials: DevCredentials = (
            ensure_credentials(self.settings.credentials_path)
            if create_credentials
            else existing_credentials(self.settings.credentials_path)
        )
        self.kafka = KafkaCluster(self.settings)
        self.postgres = LocalPostgres(self.settings, self.credentials)
        self.endpoints = Endpoints(
            kafka_bootstrap=self.settings.kafka_address,
            postgres_dsn=self.settings.postgres_dsn or SecretStr(self.postgres.dsn()),
            mlflow_url=self.settings.mlflow_address,
        )
        self.mlflow = MlflowServer(self.settings, self.endpoints.dsn("mlflow"))

    # -- lifecycle -------------------------------------------------------------------------------

    def setup(self) -> None:
        """Check the prerequisites of the managed services and fetch the Kafka jars (idempotent).

        Raises PrerequisiteMissing with one line naming what to install.
        """
        if self.settings.kafka_bootstrap is None:
            self.kafka.check_java()
            self.kafka.ensure_jars()
        if self.settings.postgres_dsn is None:
            find_pg_bin(self.settings.postgres_bin_dir)

    def up(self, components: Sequence[ComponentSpec] = ()) -> dict[str, float]:
        """Start what is not running, provision topics and schema, wait for health; return seconds per service."""
        s = self.settings
        started = time.monotonic()
        timings: dict[str, float] = {}
        if s.kafka_bootstrap is None:
            self.kafka.start()  # the JVM boots while PostgreSQL and MLflow come up
        if s.postgres_dsn is None:
            self.postgres.start()
        timings["postgres"] = time.monotonic() - started
        migrate(self.endpoints.dsn())
        if s.mlflow_url is None:
            self.mlflow.start()
        with ThreadPoolExecutor(max_workers=2) as pool:
            kafka_ok = pool.submit(self._wait, "kafka", self.kafka_healthy, started, timings)
            mlflow_ok = pool.submit(self._wait, "mlflow", self.mlflow_healthy, started, timings)
            kafka_ok.result()
            ensure_topics(self.endpoints.kafka_bootstrap, self.topics.all(), replication=self.replication)
            mlflow_ok.result()
        if s.mlflow_url is None:
            self.mlflow.yield_cpu()
        for spec in components:
            argv = list(spec.argv)
            if spec.restart:
                argv = [sys.executable, "-m", "infra.keeper", "--state", str(self.keeper_state_path(spec.name)), "--"]
                argv += spec.argv
            # The component inherits this environment (PATH, ...) with its own settings on top.
            inherited = {key: value for key, value in os.environ.items() if key not in spec.clear_env}
            self.component(spec.name).start(argv, env={**inherited, **spec.env})
        components_started = time.monotonic()
        for spec in components:
            if spec.health_url is not None:
                url = spec.health_url
                self._wait(
                    spec.name,
                    lambda url=url: http_ok(url),  # type: ignore[misc]
                    components_started,
                    timings,
                    self.settings.component_startup_timeout_s,
                )
        return timings

    def _wait(
        self,
        name: str,
        check: Callable[[], bool],
        started: float,
        timings: dict[str, float],
        budget_s: float | None = None,
    ) -> None:
        budget = budget_s if budget_s is not None else self.settings.startup_timeout_s
        remaining = budget - (time.monotonic() - started)
        if not wait_until(check, timeout_s=max(remaining, 1.0), interval_s=0.3):
            log = self.settings.logs_dir / f"{name}.log"
            raise ServiceStartError(
                f"{name} was not healthy within {budget:.0f} s; see {log}, which ends:\n{_tail(log)}"
            )
        timings[name] = time.monotonic() - started

    def down(self, components: Sequence[str] = ()) -> list[str]:
        """Stop every component and every service this stack started; return the names stopped."""
        stopped = []
        services = {"mlflow", *self.kafka.names}
        names = set(components) | {p.stem for p in self.settings.run_dir.glob("*.pid")} - services
        for name in sorted(names):
            if self.component(name).stop():
                stopped.append(name)
        if self.mlflow.stop():
            stopped.append("mlflow")
        if self.kafka.stop():
            stopped.append("kafka")
        if self.settings.postgres_dsn is None and self.postgres.stop():
            stopped.append("postgres")
        return stopped

    def purge(self, components: Sequence[str] = ()) -> list[str]:
        """Stop everything, then delete all local state: data, logs, credentials and the cluster."""
        stopped = self.down(components)
        if self.settings.postgres_dsn is None:
            self.postgres.remove()
        shutil.rmtree(self.settings.state_dir, ignore_errors=True)
        return stopped

    def component(self, name: str) -> ManagedProcess:
        return ManagedProcess(name, self.settings.run_dir, self.settings.logs_dir)

    def keeper_state_path(self, name: str) -> Path:
        """Where the keeper of component ``name`` records its child's pid and restarts."""
        return self.settings.run_dir / f"{name}.keeper.json"

    def component_child_pid(self, name: str) -> int | None:
        """The pid of the component's own process under its keeper (what a crash would kill), if running."""
        state = read_state(self.keeper_state_path(name))
        return state.child_pid if state is not None and self.component(name).pid() is not None else None

    # -- health ----------------------------------------------------------------------------------

    @property
    def replication(self) -> Replication:
        """The replication of the loop's topics: the setting, or as many replicas as local brokers (at most 3).
        An external Kafka is taken to hold as many brokers as the setting asks for."""
        if self.settings.kafka_bootstrap is None:
            return self.topics.replication(self.settings.kafka_brokers)
        return self.topics.replication(self.topics.replication_factor or 1)

    def kafka_healthy(self) -> bool:
        """The local cluster: every broker answers and is registered; an external one: it answers."""
        if self.settings.kafka_bootstrap is None:
            return self.kafka.healthy()
        return kafka_answers(self.endpoints.kafka_bootstrap)

    def postgres_healthy(self) -> bool:
        return postgres_answers(self.endpoints.dsn())

    def mlflow_healthy(self) -> bool:
        return mlflow_answers(self.endpoints.mlflow_url)

    def status(self, components: Sequence[ComponentSpec] = ()) -> dict[str, Any]:
        """Each service and component with its address and health (the shape of ``status --json``)."""
        e = self.endpoints
        s = self.settings
        services = {
            "kafka": {
                "healthy": self.kafka_healthy(),
                "address": e.kafka_bootstrap,
                "managed": s.kafka_bootstrap is None,
            },
            "postgres": {
                "healthy": self.postgres_healthy(),
                "dsn": _redact_dsn(e.dsn()),
                "managed": s.postgres_dsn is None,
            },
            "mlflow": {"healthy": self.mlflow_healthy(), "url": e.mlflow_url, "managed": s.mlflow_url is None},
        }
        result: dict[str, Any] = {"services": services, "components": {}}
        for spec in components:
            pid = self.component(spec.name).pid()
            healthy = pid is not None and (spec.health_url is None or http_ok(spec.health_url))
            entry: dict[str, Any] = {"healthy": healthy, "url": spec.health_url, "pid": pid}
            keeper = read_state(self.keeper_state_path(spec.name)) if pid is not None else None
            if keeper is not None:
                entry["restarts"] = keeper.restarts
            if spec.status_url is not None and pid is not None:
                entry["details"] = http_json(spec.status_url)
            if spec.lag_group is not None and not services["kafka"]["healthy"]:
                entry["lag"] = None  # asking a broker that is down would block for minutes in kafka-python's bootstrap
            elif spec.lag_group is not None:
                try:
                    entry["lag"] = consumer_lag(e.kafka_bootstrap, spec.lag_group, spec.lag_topics)
                except ServiceUnavailable:
                    entry["lag"] = None
            result["components"][spec.name] = entry
        return result


def _redact_dsn(dsn: str) -> str:
    """The DSN with its password replaced, fit to print."""
    scheme, sep, rest = dsn.partition("://")
    if "@" not in rest:
        return dsn
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"


def _tail(log: Path, lines: int = 20) -> str:
    """The last lines of a log, for an error that names it: the state folder holding it may be purged next."""
    try:
        with log.open("rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 16_384, 0))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"
