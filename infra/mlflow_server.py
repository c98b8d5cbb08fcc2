"""The MLflow tracking server and model registry, backed by the local PostgreSQL.

Artifacts are served by the tracking server itself (``--artifacts-destination``), so clients need
only its URL. The backend URI carries the database password, so it is passed in the environment,
never on the command line where ``ps`` would show it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from infra.probes import http_ok
from infra.processes import ManagedProcess
from infra.settings import StackSettings

# The registry is never on a user's request path, and it works in bursts (a swap downloads a checkpoint,
# a promotion moves aliases and writes tags): on a machine it shares with serving, those bursts took
# the decoder's core mid-request (p99 during a swap about 1.4 x steady on 2 cores, about 1.25 at this priority).
SERVER_NICE = 10


class MlflowServer:
    """Start, stop and probe the local MLflow server."""

    def __init__(self, settings: StackSettings, backend_dsn: str) -> None:
        self.settings = settings
        # psycopg 3 through SQLAlchemy's "postgresql+psycopg" dialect.
        self.backend_uri = backend_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
        self.artifacts_dir = (settings.state_dir / "mlflow-artifacts").resolve()
        self.process = ManagedProcess("mlflow", settings.run_dir, settings.logs_dir)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.mlflow_port}"

    def start(self) -> None:
        if self.process.pid() is not None:
            return
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        mlflow_cli = Path(sys.executable).with_name("mlflow")
        argv = [
            str(mlflow_cli), "server", "--host", self.settings.host, "--port", str(self.settings.mlflow_port),
            "--workers", "1", "--artifacts-destination", self.artifacts_dir.as_uri(),
        ]  # fmt: skip
        env = dict(os.environ)
        env["MLFLOW_BACKEND_STORE_URI"] = self.backend_uri
        # The job runner starts extra worker processes we do not use; without it the server starts in seconds.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        self.process.start(argv, env=env)

    def yield_cpu(self) -> None:
        """Put the running server at :data:`SERVER_NICE`: once it answers, not while it starts (it imports
        for seconds, while the Kafka broker boots beside it, and the stack waits for both)."""
        self.process.lower_priority(SERVER_NICE)

    def stop(self) -> bool:
        return self.process.stop(timeout_s=20)

    def healthy(self) -> bool:
        return mlflow_answers(self.url)


def mlflow_answers(url: str) -> bool:
    """True when the tracking server at ``url`` answers its health endpoint."""
    return http_ok(f"{url}/health")
