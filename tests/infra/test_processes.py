"""Background processes of the local stack: a service started at a lower CPU priority keeps it, forks included."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from infra.processes import ManagedProcess, wait_until
from infra.stack import Stack

# A parent that forks a worker after it started, as the MLflow server forks its uvicorn worker.
FORKS_LATER = """
import os, sys, time
time.sleep(0.5)
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
sys.stdout.write("forked\\n"); sys.stdout.flush()
time.sleep(60)
"""


def _autogroup_nice(pid: int) -> int | None:
    """The nice value of ``pid``'s autogroup ("/autogroup-7 nice 10"), or None on a kernel without autogroups."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text(encoding="ascii").split()[-1])
    except OSError:
        return None


def test_a_process_started_nice_runs_at_that_priority_and_so_do_its_later_workers(tmp_path: Path) -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    process = ManagedProcess("forker", tmp_path / "run", tmp_path / "logs")
    pid = process.start([sys.executable, "-c", FORKS_LATER], nice=10)
    try:
        assert wait_until(lambda: "forked" in process.log_path.read_text(encoding="utf-8"), timeout_s=30)
        (worker,) = psutil.Process(pid).children()
        for member in (pid, worker.pid):
            assert os.getpriority(os.PRIO_PROCESS, member) == 10
            assert _autogroup_nice(member) in (None, 10)  # the session's group, where the kernel has them
        # Ours is untouched: only the started session yields.
        assert os.getpriority(os.PRIO_PROCESS, 0) == ours
    finally:
        process.stop(timeout_s=5)


def test_a_process_started_without_nice_keeps_the_normal_priority(tmp_path: Path) -> None:
    process = ManagedProcess("plain", tmp_path / "run", tmp_path / "logs")
    pid = process.start([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)  # inherited, as ever
        assert _autogroup_nice(pid) in (None, 0)  # a new session's group starts at the normal priority
    finally:
        process.stop(timeout_s=5)


def test_the_stacks_mlflow_server_yields_the_cpu_to_serving(stack: Stack) -> None:
    pid = stack.mlflow.process.pid()
    if pid is None:
        pytest.skip("this stack uses an MLflow server it did not start")
    members = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    assert len(members) >= 2  # the server and its worker, which answers the requests
    for member in members:
        assert os.getpriority(os.PRIO_PROCESS, member) == 10
        assert _autogroup_nice(member) in (None, 10)
