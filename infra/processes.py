"""Background processes that the local stack starts, tracked by pid files so ``down`` can find them.

A process is started in a session of its own, so that stopping it stops everything it forked (the
MLflow server's workers, say) and a Ctrl-C in the terminal that ran ``liveloop up`` does not reach it.
The pid file records the process's start time as well, so that a pid the system has since reused for
some unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from infra.errors import ServiceStartError

# Children this process started, kept so they are reaped (no zombies) and never garbage-collected
# while running (subprocess warns about that).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ManagedProcess:
    """One named background process with its pid file under ``run_dir`` and its log under ``log_dir``."""

    name: str
    run_dir: Path
    log_dir: Path

    @property
    def pid_path(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> int:
        """Start the process unless it already runs; return its pid."""
        running = self.pid()
        if running is not None:
            return running
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(env) if env is not None else None,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServiceStartError(f"cannot start {self.name} ({argv[0]}): {exc}") from exc
        _CHILDREN[proc.pid] = proc
        record = {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(), "argv": list(argv)}
        tmp = self.pid_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(self.pid_path)
        return proc.pid

    def pid(self) -> int | None:
        """The pid if the process this pid file names is still alive, else None."""
        try:
            record = json.loads(self.pid_path.read_text(encoding="utf-8"))
            proc = psutil.Process(int(record["pid"]))
            # Allow for float rounding in create_time; a reused pid differs by far more.
            if abs(proc.create_time() - float(record["create_time"])) > 0.5:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return int(proc.pid)
        except (FileNotFoundError, ValueError, KeyError, psutil.Error):
            return None

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Stop the process and everything in its session: SIGTERM, then SIGKILL. True if it was running."""
        pid = self.pid()
        if pid is None:
            self.pid_path.unlink(missing_ok=True)
            return False
        members = _session_members(pid)
        _signal_all(members, signal.SIGTERM)
        _, alive = psutil.wait_procs(members, timeout=timeout_s)
        if alive:
            _signal_all(alive, signal.SIGKILL)
            psutil.wait_procs(alive, timeout=5)
        self.pid_path.unlink(missing_ok=True)
        _reap(pid)
        return True

    def lower_priority(self, nice: int) -> bool:
        """Lower the CPU priority of the process and everything in its session to ``nice`` (1-19); False if
        it does not run.

        Linux with autogroups (the default on desktop and many server kernels) shares the CPU fairly
        between sessions before it looks at a process's own nice value, so the session's autogroup is
        reniced (``/proc/<pid>/autogroup``: every process of the session, workers forked later included),
        and so is each process of the session, for kernels without autogroups (later forks inherit it).
        Lowering a priority needs no privilege; where it fails the process keeps its priority, which only
        makes it slower for others.
        """
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/autogroup").write_text(str(nice), encoding="ascii")
        for member in _session_members(pid):
            with contextlib.suppress(psutil.Error):
                member.nice(nice)
        return True

    def kill(self) -> None:
        """SIGKILL the process and its session at once, as a crash would (for fault-injection tests)."""
        pid = self.pid()
        if pid is not None:
            members = _session_members(pid)
            _signal_all(members, signal.SIGKILL)
            psutil.wait_procs(members, timeout=5)
            _reap(pid)


def _reap(pid: int) -> None:
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)


def _session_members(pid: int) -> list[psutil.Process]:
    """The leader and every process that shares its session id (what start_new_session made)."""
    try:
        leader = psutil.Process(pid)
        sid = os.getsid(pid)
    except (psutil.Error, ProcessLookupError):
        return []
    members = [leader]
    for proc in psutil.process_iter():
        try:
            if proc.pid != pid and os.getsid(proc.pid) == sid:
                members.append(proc)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return members


def _signal_all(procs: Sequence[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.25) -> bool:
    """Poll ``check()`` until it returns true or ``timeout_s`` passes; return the last result."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
