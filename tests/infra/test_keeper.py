"""The keeper restarts a component that dies and stops it for good when told to."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil

from infra.keeper import FIRST_DELAY_S, MAX_DELAY_S, backoff, read_state
from infra.processes import ManagedProcess, wait_until


def test_backoff_doubles_while_crashing_and_resets_after_a_healthy_run() -> None:
    delays = [FIRST_DELAY_S]
    for _ in range(7):
        delays.append(backoff(delays[-1], ran_for=0.5))
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert MAX_DELAY_S == 30
    assert backoff(30, ran_for=31) == FIRST_DELAY_S


def test_a_killed_child_is_restarted_and_stop_leaves_nothing(tmp_path: Path) -> None:
    state_path = tmp_path / "sleeper.keeper.json"
    process = ManagedProcess("sleeper", tmp_path / "run", tmp_path / "logs")
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    keeper_pid = process.start([sys.executable, "-m", "infra.keeper", "--state", str(state_path), "--", *sleeper])

    def child() -> int | None:
        state = read_state(state_path)
        return state.child_pid if state else None

    assert wait_until(lambda: child() is not None, timeout_s=20)
    first = child()
    assert first is not None
    os.kill(first, signal.SIGKILL)  # a crash
    assert wait_until(lambda: child() not in (None, first), timeout_s=20)
    state = read_state(state_path)
    assert state is not None
    assert (state.restarts, state.last_exit) == (1, -signal.SIGKILL)
    second = child()
    assert second is not None
    assert psutil.pid_exists(second)

    assert process.stop(timeout_s=10)
    assert not psutil.pid_exists(keeper_pid) or psutil.Process(keeper_pid).status() == psutil.STATUS_ZOMBIE
    assert wait_until(lambda: not psutil.pid_exists(second), timeout_s=10)
    final = read_state(state_path)
    assert final is not None
    assert (final.child_pid, final.restarts) == (None, 1)
