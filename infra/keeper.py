"""Keeps one component of the loop running: ``python -m infra.keeper --state FILE -- ARGV...``.

``liveloop up`` starts each component under a keeper rather than directly. The keeper runs the
command as its child and, whenever the child dies for any reason other than the keeper being told to
stop, starts it again after a back-off: 1 s, doubling up to 30 s while the child keeps dying within
30 s of its start, and back to 1 s once it ran longer than that. A crash loop therefore costs little
CPU, and a component that crashed once is back within a second.

The keeper lives in the same process session as its child (see :mod:`infra.processes`), so ``down``
stops both at once; on SIGTERM or SIGINT the keeper forwards the signal, waits for the child and exits
without restarting it. The state file (JSON: the child's pid, restarts so far, the last exit status)
lets ``status`` report restarts and lets fault-injection tests kill the child alone.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from pydantic import BaseModel

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
HEALTHY_AFTER_S = 30.0


class KeeperState(BaseModel):
    """What the keeper writes after every start and exit of its child."""

    child_pid: int | None = None
    restarts: int = 0
    last_exit: int | None = None
    started_at: float | None = None


def read_state(path: Path) -> KeeperState | None:
    """The keeper's last state, or None if there is none (not started under a keeper)."""
    try:
        return KeeperState.model_validate_json(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def _write(path: Path, state: KeeperState) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(), encoding="utf-8")
    tmp.replace(path)


def backoff(delay: float, ran_for: float) -> float:
    """The next wait before a restart: back to the first delay after a healthy run, else doubled."""
    return FIRST_DELAY_S if ran_for >= HEALTHY_AFTER_S else min(delay * 2, MAX_DELAY_S)


def keep(argv: list[str], state_path: Path) -> int:
    """Run ``argv`` until told to stop, restarting it whenever it dies; return the last exit status."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    state = KeeperState()
    delay = FIRST_DELAY_S
    status = 0
    while not stopping:
        started = time.monotonic()
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        state = state.model_copy(update={"child_pid": child.pid, "started_at": time.time()})
        _write(state_path, state)
        status = child.wait()
        if stopping:
            break
        delay = backoff(delay, time.monotonic() - started) if state.restarts else FIRST_DELAY_S
        state = state.model_copy(update={"child_pid": None, "last_exit": status, "restarts": state.restarts + 1})
        _write(state_path, state)
        print(f"keeper: {argv[0]} exited with {status}; restart {state.restarts} in {delay:.0f} s", flush=True)
        deadline = time.monotonic() + delay
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
    _write(state_path, state.model_copy(update={"child_pid": None, "last_exit": status}))
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, required=True, help="Where to write the keeper's state (JSON).")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command to keep running.")
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("give the command to keep running after --")
    sys.exit(keep(argv, args.state))


if __name__ == "__main__":
    main()
