"""Faults, injected into a running loop, each timed until the part it hit works again.

A component is crashed the way a crash happens: SIGKILL to its own process (never a clean stop), and its
keeper (``infra.keeper``) must bring it back. The broker and PostgreSQL are restarted (stopped and started
again) under the running components, which must reconnect on their own. What "works again" means:

- a component with a health URL: it answers healthy from a new process (the learner: ``/status`` says
  ``running``, i.e. it finished recovering from its last checkpoint and journal);
- a consumer without one (archiver, gate): a new process runs and its consumer group's lag is back to
  what it was before the fault (or small);
- Kafka and PostgreSQL: the service answers, and new events reach PostgreSQL again (the loop flows).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from infra.errors import ServiceUnavailable
from infra.kafka_broker import under_replicated
from infra.lag import consumer_lag
from infra.probes import http_json, http_ok
from infra.processes import wait_until
from tests.reliability.loop import Loop

RECOVERY_TIMEOUT_S = 300.0


@dataclass
class Fault:
    """One injected fault and how long the loop took to get over it."""

    target: str
    kind: str
    at_s: float
    """Seconds since the traffic started."""
    recovered: bool = False
    recovery_s: float | None = None
    detail: str = ""


class FaultInjector:
    """Injects faults into ``loop`` and measures recoveries; :attr:`faults` is the log."""

    def __init__(self, loop: Loop, started: float) -> None:
        self.loop = loop
        self.started = started
        self.faults: list[Fault] = []

    # -- components -------------------------------------------------------------------------------

    def kill_component(self, name: str, *, when: Callable[[], bool] | None = None, label: str = "") -> Fault:
        """SIGKILL component ``name``'s own process (optionally once ``when()`` holds), then time its recovery."""
        stack = self.loop.stack
        pid = stack.component_child_pid(name)
        if pid is None:
            raise AssertionError(f"component {name} has no running process to kill")
        if when is not None and not wait_until(when, timeout_s=240, interval_s=0.05):
            raise AssertionError(f"the moment to kill {name} ({label}) never came within 240 s")
        pid = stack.component_child_pid(name) or pid
        lag_before = self._lag(name)
        fault = Fault(target=name, kind=f"SIGKILL{' ' + label if label else ''}", at_s=self._now())
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        fault.recovered = wait_until(
            lambda: self._component_back(name, pid, lag_before), timeout_s=RECOVERY_TIMEOUT_S, interval_s=0.25
        )
        fault.recovery_s = round(time.monotonic() - killed_at, 2)
        fault.detail = f"pid {pid} killed; restarts {self._restarts(name)}"
        self.faults.append(fault)
        return fault

    def _component_back(self, name: str, old_pid: int, lag_before: int | None) -> bool:
        stack = self.loop.stack
        pid = stack.component_child_pid(name)
        if pid is None or pid == old_pid:
            return False
        spec = self.loop.spec(name)
        if spec.status_url is not None:
            return (http_json(spec.status_url) or {}).get("state") == "running"
        if spec.health_url is not None:
            return http_ok(spec.health_url)
        lag = self._lag(name)
        return lag is not None and lag <= max(2 * (lag_before or 0), 500)

    def _lag(self, name: str) -> int | None:
        spec = self.loop.spec(name)
        if spec.lag_group is None:
            return None
        try:
            return consumer_lag(self.loop.stack.endpoints.kafka_bootstrap, spec.lag_group, spec.lag_topics)
        except ServiceUnavailable:
            return None

    def _restarts(self, name: str) -> int:
        from infra.keeper import read_state

        state = read_state(self.loop.stack.keeper_state_path(name))
        return state.restarts if state is not None else 0

    # -- services ---------------------------------------------------------------------------------

    def restart_kafka(self, down_s: float = 5.0) -> Fault:
        """Stop the broker (a controlled shutdown), keep it down ``down_s``, start it; time until events flow."""
        stack = self.loop.stack
        fault = Fault(target="kafka", kind="restart", at_s=self._now())
        stack.kafka.stop()
        time.sleep(down_s)
        return self._service_back(fault, stack.kafka.start, stack.kafka_healthy)

    def kill_broker(self, node: int, topics: list[str], down_s: float = 5.0) -> Fault:
        """SIGKILL broker ``node`` (from 1) of the local cluster, keep it down ``down_s``, start it again; time until
        it is registered, every partition of ``topics`` has all its replicas in sync again, and events flow."""
        stack = self.loop.stack
        broker = stack.kafka.brokers[node - 1]
        pid = broker.process.pid()
        if pid is None:
            raise AssertionError(f"broker {node} has no running process to kill")
        fault = Fault(target=broker.name, kind="SIGKILL", at_s=self._now())
        os.kill(pid, signal.SIGKILL)
        time.sleep(down_s)
        bootstrap = stack.endpoints.kafka_bootstrap
        return self._service_back(
            fault, broker.start, lambda: stack.kafka_healthy() and under_replicated(bootstrap, topics) == 0
        )

    def restart_postgres(self, down_s: float = 5.0) -> Fault:
        """Stop PostgreSQL (fast shutdown: open transactions roll back), start it again; time until events flow."""
        stack = self.loop.stack
        fault = Fault(target="postgres", kind="restart", at_s=self._now())
        stack.postgres.stop()
        time.sleep(down_s)
        return self._service_back(fault, stack.postgres.start, stack.postgres_healthy)

    def _service_back(self, fault: Fault, start: Callable[[], None], healthy: Callable[[], bool]) -> Fault:
        restarted_at = time.monotonic()
        wall = datetime.now(UTC)
        start()
        answered = wait_until(healthy, timeout_s=RECOVERY_TIMEOUT_S, interval_s=0.25)
        answered_s = time.monotonic() - restarted_at
        flowing = answered and wait_until(lambda: self._archived_since(wall), timeout_s=RECOVERY_TIMEOUT_S)
        fault.recovered = flowing
        fault.recovery_s = round(time.monotonic() - restarted_at, 2)
        fault.detail = f"answered after {answered_s:.1f} s; events archived again after {fault.recovery_s:.1f} s"
        self.faults.append(fault)
        return fault

    def _archived_since(self, moment: datetime) -> bool:
        try:
            with psycopg.connect(self.loop.stack.endpoints.dsn(), connect_timeout=3) as conn:
                row = conn.execute("SELECT count(*) FROM events WHERE archived_at > %s", (moment,)).fetchone()
        except psycopg.Error:
            return False
        return row is not None and int(row[0]) > 0

    def _now(self) -> float:
        return round(time.monotonic() - self.started, 1)


def learner_activity(loop: Loop, activity: str) -> Callable[[], bool]:
    """A ``when`` for :meth:`FaultInjector.kill_component`: the learner is ``training`` / ``checkpointing`` now."""
    url = loop.spec("learner").status_url
    assert url is not None
    return lambda: (http_json(url) or {}).get("activity") == activity
