"""A whole loop for the reliability tests: the services and all six components, as ``liveloop up`` runs them.

It lives in a temporary state folder on free ports (so it never meets a developer's stack), with the
demo's compressed cadence and a permissive gate policy: these tests judge that the plumbing survives
faults, not that a checkpoint learned something, so every checkpoint that loads and evaluates is
promoted. The components read their settings from the environment of the process that starts them,
so the loop sets its variables in ``os.environ`` for its lifetime and puts the old values back after.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from infra.lag import consumer_lag
from infra.settings import StackSettings
from infra.stack import ComponentSpec, Stack
from liveloop.components import loop_components
from liveloop.demo.run import DEMO_ENVIRONMENT, make_base_model
from liveloop.demo.simulator.settings import SimulatorSettings
from tests.conftest import free_port, free_port_run

# Every checkpoint that loads, evaluates and keeps its KL in bounds is promoted (see the module docstring).
PERMISSIVE_GATE = {
    "version": "reliability-1",
    "auto_promote": True,
    "min_held_out_samples": 5,
    "min_reward_improvement": -1000.0,
    "min_improvement_ci_low": -1000.0,
    "min_ess": 1.0,
    "min_regression_pass_rate": 0.0,
    "max_kl": 1000.0,
    "min_distinct_share_ratio": 0.0,
    "min_entropy_ratio": 0.0,
    "max_well_formed_drop": 1.0,
}


@dataclass
class Loop:
    """A running loop: its stack, its components and where to reach them."""

    stack: Stack
    components: list[ComponentSpec]
    ingest_url: str
    gateway_url: str
    base_version: int

    def component_names(self) -> list[str]:
        return [spec.name for spec in self.components]

    def spec(self, name: str) -> ComponentSpec:
        return next(spec for spec in self.components if spec.name == name)

    def processes(self) -> dict[str, list[psutil.Process]]:
        """name -> the processes that make it up now (keeper, component and its children; or the service)."""
        found: dict[str, list[psutil.Process]] = {}
        names = [*self.component_names(), *self.stack.kafka.names, "mlflow"]
        for name in names:
            pid = self.stack.component(name).pid()
            if pid is None:
                continue
            try:
                root = psutil.Process(pid)
                found[name] = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
        postmaster = _postmaster(self.stack)
        if postmaster is not None:
            found["postgres"] = [postmaster, *postmaster.children(recursive=True)]
        return found


def _postmaster(stack: Stack) -> psutil.Process | None:
    pid_file = stack.postgres.data_dir / "postmaster.pid"
    try:
        return psutil.Process(int(pid_file.read_text(encoding="utf-8").split()[0]))
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def running_loop(
    state_dir: Path, extra_env: Mapping[str, str] | None = None, seed: int = 7, brokers: int = 1
) -> Iterator[Loop]:
    """Start a whole loop in ``state_dir`` on ``brokers`` Kafka brokers (three: replication factor 3, two in
    sync); purge everything (processes, cluster, files) on the way out."""
    ports = {
        name: str(free_port())
        for name in ("LIVELOOP_DISTILL_WEB_PORT", "LIVELOOP_LEARNER_STATUS_PORT", "LIVELOOP_DASHBOARD_PORT")
    }
    # Replica n of the ingest API and of the gateway listens on the port + n - 1 (LIVELOOP_REPLICAS_*).
    ports |= {name: str(free_port_run(4)) for name in ("LIVELOOP_INGEST_PORT", "LIVELOOP_SERVING_PORT")}
    state_dir.mkdir(parents=True, exist_ok=True)
    policy = state_dir / "gate-policy.json"
    policy.write_text(json.dumps(PERMISSIVE_GATE), encoding="utf-8")
    env = {
        **DEMO_ENVIRONMENT,
        "LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S": "45",
        "LIVELOOP_GATE_POLICY_PATH": str(policy),
        **ports,
        **(extra_env or {}),
    }
    with _environment(env):
        kafka_base = free_port_run(2 * brokers)  # broker n: base + 2(n-1), its controller the port after
        stack = Stack(
            StackSettings(
                state_dir=state_dir,
                kafka_brokers=brokers,
                kafka_port=kafka_base,
                kafka_controller_port=kafka_base + 1,
                # Several JVMs beside the whole loop on a small machine: each broker gets less heap.
                kafka_heap_opts="-Xms256m -Xmx1g" if brokers == 1 else "-Xms128m -Xmx512m",
                postgres_port=free_port(),
                mlflow_port=free_port(),
                # Services and components start slowly beside three JVMs on a shared 2-core machine.
                startup_timeout_s=300.0,
                component_startup_timeout_s=600.0,
            )
        )
        try:
            stack.up()
            base_folder, base_version = make_base_model(stack, "semicolons", seed)
            with _environment({"LIVELOOP_LEARNER_BASE_MODEL": str(base_folder)}):
                components = loop_components(stack)
                stack.up(components)
                yield Loop(
                    stack=stack,
                    components=components,
                    ingest_url=f"http://127.0.0.1:{ports['LIVELOOP_INGEST_PORT']}",
                    gateway_url=f"http://127.0.0.1:{ports['LIVELOOP_SERVING_PORT']}/v1",
                    base_version=base_version,
                )
        finally:
            stack.purge([spec.name for spec in loop_components(stack)])


def simulator_settings(loop: Loop, state: Path, seed: int) -> SimulatorSettings:
    """The simulator's settings for traffic against ``loop`` (stopped by the test, not by its minutes)."""
    return SimulatorSettings(
        gateway_url=loop.gateway_url,
        credentials_path=loop.stack.settings.credentials_path,
        ingest_url=loop.ingest_url,
        bootstrap=loop.stack.endpoints.kafka_bootstrap,
        events_topic=loop.stack.topics.events.name,
        sdk_journal_dir=state / "simulator-journal",
        profile="semicolons",
        seed=seed,
        minutes=120,  # stopped by the test once the faults are over and the loop has promoted again
        session_rate=0.7,
        concurrency=8,
        drain_s=30,
        request_timeout_s=20,
        secret_share=0.1,
        privacy_share=0.1,
    )


def drained_consumers(loop: Loop) -> bool:
    """Whether the archiver and the distiller have consumed everything (a broker still settling: not yet)."""
    bootstrap = loop.stack.endpoints.kafka_bootstrap
    for name in ("archiver", "distiller"):
        spec = loop.spec(name)
        assert spec.lag_group is not None
        try:
            if consumer_lag(bootstrap, spec.lag_group, spec.lag_topics) > 0:
                return False
        except Exception:  # a broker still settling is "not yet"
            return False
    return True
