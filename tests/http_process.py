"""Running one of our HTTP services as production runs it, ``python -m <module>``, for a test or a benchmark."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def http_process(
    module: str, env: Mapping[str, str], url: str, log_path: Path, ready_within_s: float = 60.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``python -m module`` (its output to ``log_path``), wait until ``url``/readyz answers 200 and
    yield the process; stop it afterwards (terminate, then kill if it does not end within 30 s).

    A process that exits before it is ready fails the caller with its log."""
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=dict(env), stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + ready_within_s
        while not _ready(url):
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"{module} did not become ready within {ready_within_s:.0f} s"
            time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
