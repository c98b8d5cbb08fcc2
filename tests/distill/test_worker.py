"""The distiller's worker ends after a crash even when its shutdown hangs (``distill.worker``).

A real Faust worker on the test broker runs an app with one service whose stop never finishes and a
timer that crashes the app, as a failed agent or audit-store write does. Faust's own shutdown then
waits forever; the worker must still exit, with its own status, shortly after the crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from distill.worker import CRASH_EXIT_CODE
from infra.stack import Endpoints
from tests.conftest import free_port
from tests.distill.stream_harness import FAUST_ENV, REPO_ROOT

HANGING_WORKER = """
import asyncio, sys
import faust, mode
from distill import worker

worker.CRASH_EXIT_S = float(sys.argv[3])
app = faust.App(sys.argv[2], broker="kafka://" + sys.argv[1], store="memory://", web_port=int(sys.argv[4]),
                web_host="127.0.0.1", web_bind="127.0.0.1", datadir=sys.argv[5])

@app.service
class StopsNever(mode.Service):
    async def on_stop(self) -> None:
        await asyncio.sleep(3600)

@app.timer(interval=1.0)
async def fail() -> None:
    await app.crash(RuntimeError("a planted failure"))

worker.CrashExitingWorker(app, loglevel="warning").execute_from_commandline()
"""


@pytest.mark.timeout(120)
def test_a_crashed_worker_whose_shutdown_hangs_still_exits(endpoints: Endpoints, tmp_path: Path) -> None:
    crash_exit_s = 3.0
    log = tmp_path / "worker.log"
    app_id, data_dir = f"hanging-{uuid.uuid4().hex[:8]}", tmp_path / "data"  # not the repository (its cwd)
    args = [endpoints.kafka_bootstrap, app_id, str(crash_exit_s), str(free_port()), str(data_dir)]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-c", HANGING_WORKER, *args],
            cwd=REPO_ROOT,
            env={**os.environ, **FAUST_ENV},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            code = worker.wait(timeout=90)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    text = log.read_text()
    assert "Crashed reason=RuntimeError('a planted failure')" in text, text[-3000:]
    assert code == CRASH_EXIT_CODE, text[-3000:]
    assert "did not stop within 3.0 s of its crash" in text, text[-3000:]


def test_a_pending_hard_exit_does_not_keep_a_process_alive() -> None:
    """A worker that stops in time exits with its own status: the hard exit waits on a daemon thread."""
    script = "from distill.worker import exit_hard_after; exit_hard_after(30.0, RuntimeError('x')); print('done')"
    started = time.monotonic()
    finished = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, timeout=20)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == b"done"
    assert time.monotonic() - started < 20  # a daemon timer does not keep the process alive
