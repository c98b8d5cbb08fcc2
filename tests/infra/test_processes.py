"""Background processes of the local stack: a service put at a lower CPU priority stays there, forks included;
a component that never answers fails ``up`` with what its log last said."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from infra.errors import ServiceStartError
from infra.processes import ManagedProcess, wait_until
from infra.settings import StackSettings
from infra.stack import ComponentSpec, Endpoints, Stack
from tests.conftest import free_port

# Forks a worker at once, and another once the file named by argv[1] exists (as a server replaces a worker).
FORKS = """
import os, sys, time
def worker():
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
worker()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
worker()
time.sleep(60)
"""


def _autogroup_nice(pid: int) -> int | None:
    """The nice value of ``pid``'s autogroup ("/autogroup-7 nice 10"), or None on a kernel without autogroups."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text(encoding="ascii").split()[-1])
    except OSError:
        return None


def test_a_lowered_process_runs_at_that_priority_with_its_workers_then_and_later(tmp_path: Path) -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    go = tmp_path / "go"
    process = ManagedProcess("forker", tmp_path / "run", tmp_path / "logs")
    pid = process.start([sys.executable, "-c", FORKS, str(go)])
    try:
        assert wait_until(lambda: len(psutil.Process(pid).children()) == 1, timeout_s=30)
        assert os.getpriority(os.PRIO_PROCESS, pid) == ours  # started at the normal priority
        assert _autogroup_nice(pid) in (None, 0)  # a new session's group starts at the normal priority
        assert process.lower_priority(10)
        go.touch()
        assert wait_until(lambda: len(psutil.Process(pid).children()) == 2, timeout_s=30)
        for member in (pid, *(child.pid for child in psutil.Process(pid).children())):
            assert os.getpriority(os.PRIO_PROCESS, member) == 10
            assert _autogroup_nice(member) in (None, 10)  # the session's group, where the kernel has them
        assert os.getpriority(os.PRIO_PROCESS, 0) == ours  # only the process's session yields
    finally:
        process.stop(timeout_s=5)
    assert not process.lower_priority(10)  # nothing runs: nothing to renice


def test_the_stacks_mlflow_server_yields_the_cpu_to_serving(stack: Stack) -> None:
    pid = stack.mlflow.process.pid()
    if pid is None:
        pytest.skip("this stack uses an MLflow server it did not start")
    members = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    assert len(members) >= 2  # the server and its worker, which answers the requests
    for member in members:
        assert os.getpriority(os.PRIO_PROCESS, member) == 10
        assert _autogroup_nice(member) in (None, 10)


def test_a_component_that_never_answers_fails_up_with_the_end_of_its_log(
    endpoints: Endpoints, fresh_database: str, tmp_path: Path
) -> None:
    """The error shows why: ``liveloop demo`` purges the state folder (and the log in it) as it exits."""
    settings = StackSettings(
        state_dir=tmp_path / "state",
        kafka_bootstrap=endpoints.kafka_bootstrap,
        postgres_dsn=fresh_database,
        mlflow_url=endpoints.mlflow_url,
        component_startup_timeout_s=3,
    )
    script = "import time; print('[Errno 98] address already in use', flush=True); time.sleep(60)"
    silent = ComponentSpec(
        name="silent",
        argv=[sys.executable, "-c", script],
        health_url=f"http://127.0.0.1:{free_port()}/healthz",
        restart=False,
    )
    stack = Stack(settings)
    try:
        with pytest.raises(ServiceStartError, match=r"(?s)silent was not healthy within 3 s.*address already in use"):
            stack.up([silent])
    finally:
        stack.down(["silent"])
